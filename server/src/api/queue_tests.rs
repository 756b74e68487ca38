use super::job_id;
use crate::api::time_ids::TimeIds;

#[test]
fn job_ids_sort_by_the_clock_and_stay_sixteen_hex_digits() {
    let g = TimeIds::new(64, 20);
    let id = |t, draw| job_id(g.candidate(t, draw));
    let t = 1_764_835_200_000; // 2025-12-04 in milliseconds
    let ids = [id(t, u64::MAX), id(t + 1, 0), id(t + 1, 1 << 63), id(t + 2, 0)];
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
    for id in &ids {
        assert_eq!(id.len(), 16, "{id}");
        assert!(id.bytes().all(|b| b.is_ascii_hexdigit()), "{id}");
    }
    // The draw's top 20 bits are the id's low 20 bits; the clock's low 44 bits are the rest.
    assert_eq!(id(0, u64::MAX), "00000000000fffff");
    assert_eq!(id(u64::MAX, 0), "fffffffffff00000");
    assert_eq!(id(1, 1 << 44), "0000000000100001");
}
