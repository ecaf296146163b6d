//! Key → partition with Kafka's default partitioner (murmur2 of the key
//! bytes, seed 0x9747b28c, sign bit cleared, modulo the partition count), so
//! Kafka users can predict where a key lands.

const SEED: u32 = 0x9747_b28c;
const M: u32 = 0x5bd1_e995;
const R: u32 = 24;

/// murmur2, 32-bit, as Kafka computes it.
pub fn murmur2(data: &[u8]) -> u32 {
    let mut h: u32 = SEED ^ (data.len() as u32);
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
    if tail.len() >= 3 {
        h ^= u32::from(tail[2]) << 16;
    }
    if tail.len() >= 2 {
        h ^= u32::from(tail[1]) << 8;
    }
    if !tail.is_empty() {
        h ^= u32::from(tail[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h
}

pub fn partition_for_key(key: &[u8], partitions: u32) -> u32 {
    (murmur2(key) & 0x7fff_ffff) % partitions.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_kafkas_murmur2() {
        // Values Kafka's Utils.murmur2 gives (as signed ints in Java).
        assert_eq!(murmur2(b"21") as i32, -973_932_308);
        assert_eq!(murmur2(b"foobar") as i32, -790_332_482);
        assert_eq!(murmur2(b"a-little-bit-long-string") as i32, -985_981_536);
        assert_eq!(
            murmur2(b"a-little-bit-longer-string") as i32,
            -1_486_304_829
        );
        assert_eq!(
            murmur2(b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8") as i32,
            -58_897_971
        );
        assert_eq!(murmur2(b"abc") as i32, 479_470_107);
    }

    #[test]
    fn the_same_key_always_lands_on_one_partition() {
        for partitions in [1, 3, 8, 1024] {
            let p = partition_for_key(b"customer-42", partitions);
            assert!(p < partitions);
            assert_eq!(p, partition_for_key(b"customer-42", partitions));
        }
    }
}
