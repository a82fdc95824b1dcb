//! The keys the store benches write: idempotency-key-shaped and random-looking.

/// splitmix64: a cheap, well-mixed function of `z`.
pub fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e3779b97f4a7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
    z ^ (z >> 31)
}

/// A UUID-shaped key, random-looking in `i`.
pub fn key(i: u64) -> String {
    let (a, b) = (splitmix(i), splitmix(i ^ 0xdead_beef_cafe_f00d));
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xffff,
        b >> 48,
        b & 0xffff_ffff_ffff
    )
}
