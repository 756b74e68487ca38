//! `picket completion bash|zsh|fish`: shell completion scripts, generated from the clap
//! definition so they never drift from the real flags.

use anyhow::Result;
use clap::CommandFactory;
use clap_complete::Shell;

use crate::args::Cli;

#[derive(Debug, clap::Args)]
pub struct CompletionArgs {
    /// The shell to generate completions for.
    #[arg(value_enum)]
    pub shell: Shell,
}

pub fn run(a: CompletionArgs) -> Result<u8> {
    let mut cmd = Cli::command();
    clap_complete::generate(a.shell, &mut cmd, "picket", &mut std::io::stdout());
    Ok(crate::exit::OK)
}
