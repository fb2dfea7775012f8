//! Pod IP allocation on the loopback range.
//!
//! Every pod gets its own 127.0.1.x – 127.0.255.254 address so two pods can bind the same
//! port, as on a real cluster. 127.0.0.0/24 is left to the host's own services.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

#[derive(Debug, Default)]
pub struct IpPool {
    used: BTreeSet<u32>,
}

const FIRST: u32 = u32::from_be_bytes([127, 0, 1, 1]);
const LAST: u32 = u32::from_be_bytes([127, 0, 255, 254]);

impl IpPool {
    /// Takes `preferred` when it is free and in range (a pod keeps its IP across an agent
    /// restart), else the lowest free address.
    pub fn allocate(&mut self, preferred: Option<Ipv4Addr>) -> Option<Ipv4Addr> {
        if let Some(ip) = preferred.map(u32::from)
            && (FIRST..=LAST).contains(&ip)
            && ip & 0xff != 0
            && ip & 0xff != 255
            && self.used.insert(ip)
        {
            return Some(Ipv4Addr::from(ip));
        }
        let ip = (FIRST..=LAST)
            .find(|ip| ip & 0xff != 0 && ip & 0xff != 255 && !self.used.contains(ip))?;
        self.used.insert(ip);
        Some(Ipv4Addr::from(ip))
    }

    pub fn release(&mut self, ip: Ipv4Addr) {
        self.used.remove(&u32::from(ip));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocated_addresses_are_distinct_and_reused_after_release() {
        let mut pool = IpPool::default();
        let a = pool.allocate(None).expect("free");
        let b = pool.allocate(None).expect("free");
        assert_eq!(a, Ipv4Addr::new(127, 0, 1, 1));
        assert_ne!(a, b);
        pool.release(a);
        assert_eq!(pool.allocate(None), Some(a));
    }

    #[test]
    fn a_pod_keeps_its_previous_address_when_free() {
        let mut pool = IpPool::default();
        let want = Ipv4Addr::new(127, 0, 3, 7);
        assert_eq!(pool.allocate(Some(want)), Some(want));
        assert_ne!(
            pool.allocate(Some(want)),
            Some(want),
            "an address is never handed out twice"
        );
        assert_ne!(
            pool.allocate(Some(Ipv4Addr::new(10, 0, 0, 1))),
            Some(Ipv4Addr::new(10, 0, 0, 1))
        );
    }
}
