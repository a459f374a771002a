//! A list of CIDR blocks, matched without allocating.

use std::{fmt, net::IpAddr, str::FromStr};

use ipnet::IpNet;

use super::request::canonical_ip;

/// A set of IPv4 and IPv6 networks (`10.0.0.0/8`, `2001:db8::/32`, or a bare address for
/// a single host). IPv4-mapped IPv6 addresses are matched as IPv4.
///
/// ```
/// use gray_rules::CidrList;
///
/// let list = CidrList::parse(["192.168.1.100", "10.0.0.0/8"])?;
/// assert!(list.contains([10, 9, 8, 7].into()));
/// assert!(list.contains("::ffff:192.168.1.100".parse()?));
/// assert!(!list.contains([192, 168, 1, 101].into()));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Default, PartialEq, Eq)]
pub struct CidrList {
    v4: Vec<(u32, u32)>,
    v6: Vec<(u128, u128)>,
    nets: Vec<IpNet>,
}

/// A string that is neither a CIDR block nor an IP address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidCidr(String);

impl fmt::Display for InvalidCidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} is neither a CIDR block (`10.0.0.0/8`) nor an IP address",
            self.0
        )
    }
}

impl std::error::Error for InvalidCidr {}

/// One network: a CIDR block or a single address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr(IpNet);

impl Cidr {
    /// The network.
    #[must_use]
    pub fn net(&self) -> IpNet {
        self.0
    }
}

impl FromStr for Cidr {
    type Err = InvalidCidr;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        if let Ok(net) = t.parse::<IpNet>() {
            return Ok(Cidr(net.trunc()));
        }
        t.parse::<IpAddr>()
            .map(|ip| Cidr(IpNet::from(canonical_ip(ip))))
            .map_err(|_| InvalidCidr(s.to_owned()))
    }
}

impl From<IpNet> for Cidr {
    fn from(net: IpNet) -> Self {
        Cidr(net.trunc())
    }
}

impl CidrList {
    /// An empty list: contains nothing.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Parses CIDR blocks and bare addresses.
    pub fn parse<S: AsRef<str>>(items: impl IntoIterator<Item = S>) -> Result<Self, InvalidCidr> {
        let mut list = CidrList::new();
        for item in items {
            list.push(item.as_ref().parse::<Cidr>()?);
        }
        Ok(list)
    }

    /// Adds one network.
    pub fn push(&mut self, cidr: impl Into<Cidr>) {
        let net = cidr.into().0;
        match net {
            IpNet::V4(n) => self
                .v4
                .push((u32::from(n.network()), u32::from(n.netmask()))),
            IpNet::V6(n) => match n.network().to_ipv4_mapped() {
                // ::ffff:a.b.c.d/n with n >= 96 is an IPv4 block.
                Some(v4) if n.prefix_len() >= 96 => {
                    let len = n.prefix_len() - 96;
                    let mask = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
                    self.v4.push((u32::from(v4) & mask, mask));
                }
                _ => self
                    .v6
                    .push((u128::from(n.network()), u128::from(n.netmask()))),
            },
        }
        self.nets.push(net);
    }

    /// `true` when `ip` is inside one of the networks.
    #[must_use]
    pub fn contains(&self, ip: IpAddr) -> bool {
        match canonical_ip(ip) {
            IpAddr::V4(v4) => {
                let a = u32::from(v4);
                self.v4.iter().any(|&(net, mask)| a & mask == net)
            }
            IpAddr::V6(v6) => {
                let a = u128::from(v6);
                self.v6.iter().any(|&(net, mask)| a & mask == net)
            }
        }
    }

    /// `true` when the list holds no network.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.nets.is_empty()
    }

    /// The networks, in the order they were added.
    pub fn iter(&self) -> impl Iterator<Item = &IpNet> {
        self.nets.iter()
    }
}

impl fmt::Debug for CidrList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.nets.iter()).finish()
    }
}

impl<C: Into<Cidr>> FromIterator<C> for CidrList {
    fn from_iter<I: IntoIterator<Item = C>>(iter: I) -> Self {
        let mut list = CidrList::new();
        for c in iter {
            list.push(c);
        }
        list
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(items: &[&str]) -> CidrList {
        items.iter().map(|s| s.parse::<Cidr>().unwrap()).collect()
    }

    #[test]
    fn matching_table() {
        let l = list(&[
            "10.0.0.0/8",
            "192.168.1.100",
            "2001:db8::/32",
            "::ffff:172.16.0.0/108",
        ]);
        for (ip, expected) in [
            ("10.255.0.1", true),
            ("11.0.0.1", false),
            ("192.168.1.100", true),
            ("192.168.1.101", false),
            ("::ffff:10.1.1.1", true),
            ("2001:db8:1::5", true),
            ("2001:db9::1", false),
            ("172.16.3.4", true),
            ("172.32.0.1", false),
        ] {
            assert_eq!(l.contains(ip.parse().unwrap()), expected, "{ip}");
        }
        assert!(!CidrList::new().contains([1, 2, 3, 4].into()));
        let any = list(&["0.0.0.0/0"]);
        assert!(any.contains([8, 8, 8, 8].into()));
        assert!("10.0.0.0/33".parse::<Cidr>().is_err());
        assert!("nonsense".parse::<Cidr>().is_err());
        // Host bits are cleared.
        assert!(list(&["10.1.2.3/8"]).contains([10, 200, 0, 0].into()));
    }
}
