use super::job_id;

#[test]
fn job_ids_sort_by_the_clock_and_stay_sixteen_hex_digits() {
    let t = 1_764_835_200_000; // 2025-12-04 in milliseconds
    let ids = [job_id(t, u64::MAX), job_id(t + 1, 0), job_id(t + 1, 1 << 63), job_id(t + 2, 0)];
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
    for id in &ids {
        assert_eq!(id.len(), 16, "{id}");
        assert!(id.bytes().all(|b| b.is_ascii_hexdigit()), "{id}");
    }
    // The draw's top 20 bits are the id's low 20 bits; the clock's low 44 bits are the rest.
    assert_eq!(job_id(0, u64::MAX), "00000000000fffff");
    assert_eq!(job_id(u64::MAX, 0), "fffffffffff00000");
    assert_eq!(job_id(1, 1 << 44), "0000000000100001");
}
