//! Kafka's key partitioners, bit-exact, so a query finds the partition (and so the task)
//! a producer sent a key to. Pure.
//!
//! Owns: murmur2 (the Java clients'), CRC-32 and FNV-1a (librdkafka's) and
//! [`partition_for`]. Must not touch: stores or routing; `task.rs` uses the same
//! functions to repartition, so changing one moves keys between tasks.

use oxbow_crds::Partitioner;

/// Kafka's murmur2 (`org.apache.kafka.common.utils.Utils.murmur2`), as the Java clients
/// and librdkafka's `murmur2` partitioners compute it.
pub fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    // Java hashes an int length; keys beyond 2 GiB do not exist in Kafka.
    let mut h = SEED ^ (data.len() as u32);
    let chunks = data.chunks_exact(4);
    let rest = chunks.remainder();
    for c in chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    // Java's switch falls through from 3 to 1; the bytes land in disjoint bits.
    let tail = match *rest {
        [a, b, c] => Some(u32::from(a) | u32::from(b) << 8 | u32::from(c) << 16),
        [a, b] => Some(u32::from(a) | u32::from(b) << 8),
        [a] => Some(u32::from(a)),
        _ => None,
    };
    if let Some(t) = tail {
        h ^= t;
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

const CRC_TABLE: [u32; 256] = {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                0xedb8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
            k += 1;
        }
        t[i] = c;
        i += 1;
    }
    t
};

/// CRC-32 (IEEE), librdkafka's `rd_crc32`.
pub fn crc32(data: &[u8]) -> u32 {
    let mut c = !0u32;
    for b in data {
        c = CRC_TABLE[((c ^ u32::from(*b)) & 0xff) as usize] ^ (c >> 8);
    }
    !c
}

/// librdkafka's `rd_fnv1a`: 32-bit FNV-1a on a signed accumulator, then its absolute
/// value (Sarama's hash partitioner), `i32::MIN` staying as is.
pub fn fnv1a(data: &[u8]) -> u32 {
    let mut h = 0x811c_9dc5_u32 as i32;
    for b in data {
        h ^= i32::from(*b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h.wrapping_abs() as u32
}

/// The partition a producer using `p` sends `key` to; `None` without partitions.
pub fn partition_for(p: Partitioner, key: &[u8], partitions: u32) -> Option<u32> {
    if partitions == 0 {
        return None;
    }
    Some(match p {
        // Utils.toPositive masks the sign bit (not abs).
        Partitioner::Murmur2 => (murmur2(key) as u32 & 0x7fff_ffff) % partitions,
        Partitioner::Crc32 => crc32(key) % partitions,
        Partitioner::Fnv1a => fnv1a(key) % partitions,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn murmur2_matches_the_java_clients() {
        // Kafka's UtilsTest.testMurmur2.
        let cases: [(&str, i32); 6] = [
            ("21", -973_932_308),
            ("foobar", -790_332_482),
            ("a-little-bit-long-string", -985_981_536),
            ("a-little-bit-longer-string", -1_486_304_829),
            (
                "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
                -58_897_971,
            ),
            ("abc", 479_470_107),
        ];
        for (k, want) in cases {
            assert_eq!(murmur2(k.as_bytes()), want, "murmur2({k:?})");
        }
    }

    #[test]
    fn murmur2_partitions_mask_the_sign_bit_like_to_positive() {
        // toPositive(-973932308) = 1173551340; % 4 = 0, % 7 = 3.
        assert_eq!(partition_for(Partitioner::Murmur2, b"21", 4), Some(0));
        assert_eq!(partition_for(Partitioner::Murmur2, b"21", 7), Some(3));
        // toPositive(479470107) = 479470107; % 4 = 3.
        assert_eq!(partition_for(Partitioner::Murmur2, b"abc", 4), Some(3));
        assert_eq!(partition_for(Partitioner::Murmur2, b"abc", 0), None);
    }

    #[test]
    fn crc32_and_fnv1a_match_librdkafka() {
        assert_eq!(crc32(b"123456789"), 0xcbf4_3926);
        assert_eq!(crc32(b""), 0);
        // librdkafka's rdfnv1a.c unit test vectors.
        assert_eq!(fnv1a(b"kafka") as i32, 0x0d33_c4e1);
        assert_eq!(fnv1a(b"giberish123456789") as i32, 0x77a5_8295);
        assert_eq!(fnv1a(b"1234") as i32, 0x023b_dd03);
        assert_eq!(fnv1a(b"") as i32, 0x7ee3_623b);
        assert_eq!(
            partition_for(Partitioner::Crc32, b"123456789", 10),
            Some(0xcbf4_3926 % 10)
        );
        assert_eq!(
            partition_for(Partitioner::Fnv1a, b"kafka", 6),
            Some(0x0d33_c4e1 % 6)
        );
    }
}
