//! Which state partition a key belongs to: Kafka's default partitioner for a keyed record
//! (the Java client's, and librdkafka's `murmur2_random`), so that producers that key their
//! records by the idempotency key put each key's records on its state partition.

/// Kafka's murmur2 of `data` (`org.apache.kafka.common.utils.Utils.murmur2`).
fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let mut h = SEED ^ data.len() as u32;
    let mut chunks = data.chunks_exact(4);
    for chunk in &mut chunks {
        let mut k = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let tail = chunks.remainder();
    if !tail.is_empty() {
        for (i, byte) in tail.iter().enumerate().rev() {
            h ^= u32::from(*byte) << (8 * i);
        }
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// The state partition of `key` among `partitions` (> 0): `toPositive(murmur2(key)) % n`,
/// as Kafka's default partitioner computes it.
pub fn state_partition(key: &str, partitions: i32) -> i32 {
    (murmur2(key.as_bytes()) & 0x7fff_ffff) % partitions.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn murmur2_matches_kafkas_own_test_vectors() {
        // From Kafka's UtilsTest.testMurmur2.
        for (data, hash) in [
            ("21", -973932308),
            ("foobar", -790332482),
            ("a-little-bit-long-string", -985981536),
            ("a-little-bit-longer-string", -1486304829),
            ("lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
            ("abc", 479470107),
        ] {
            assert_eq!(murmur2(data.as_bytes()), hash, "{data}");
        }
    }

    #[test]
    fn keys_land_where_the_java_client_puts_them() {
        // Utils.toPositive(Utils.murmur2(key)) % 3, computed with kafka-clients 4.3.1.
        assert_eq!(state_partition("a-little-bit-long-string", 3), 2);
        assert_eq!(state_partition("order-17", 3), 0);
    }

    #[test]
    fn a_key_has_one_partition_within_range() {
        for n in [1, 3, 12] {
            for key in ["a", "order-17", "ünïcode"] {
                let p = state_partition(key, n);
                assert!((0..n).contains(&p), "{key} → {p} of {n}");
                assert_eq!(p, state_partition(key, n));
            }
        }
    }
}
