//! Which addresses and interfaces a run's processes use, decided here for every runtime, and
//! whether a host can reach an address before a task counts on it.
//!
//! - **The driver's address** ([`advertise_toward`]): the driver listens on, and tells its
//!   agents, the address this host sends from toward the nodes (the kernel's route to the
//!   first node address that resolves; nothing is sent). Where the nodes reach the driver
//!   over one network only, that is this host's address on it: never loopback, nor an
//!   interface the nodes cannot reach. Without a node address, this host's name's address.
//! - **A rank's address and interface** ([`interface_for`]): a rank is reached at the address
//!   its scheduler knows its node by (Slurm's `NodeAddr`, Ray's node IP, loopback on the
//!   local runtime), and its collectives go through the interface that holds that address on
//!   its host, so that a second interface the other nodes cannot reach (a management
//!   network, another NIC) is never chosen. Where the node's address is none of the host's
//!   own (a name that resolves elsewhere, an address behind NAT), the interface of the
//!   host's route toward the driver.
//! - **Rendezvous ports** ([`free_port`]): a port free on a rank's host for it to listen on
//!   later (rank 0's `MASTER_PORT`), chosen below the kernel's ephemeral range, so that
//!   neither a connection the host makes meanwhile nor a listener that lets the kernel pick
//!   its port can take it before the rank binds it.
//! - **Reachability** ([`probe`]): a TCP connection to an address and port, bounded. An
//!   answer, a refusal included, proves the path: a rendezvous port is probed before the
//!   rank that opens it has started.
//!
//! Interfaces are read with `getifaddrs(3)` (nix), in the network namespace of the calling
//! process, as the kernel routes its packets.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream, ToSocketAddrs, UdpSocket};
use std::time::Duration;

use nix::ifaddrs::getifaddrs;

/// One address of one of this host's interfaces.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct InterfaceAddress {
    /// The interface's name (`eth0`, `lo`).
    pub interface: String,
    /// The address.
    pub address: IpAddr,
}

/// Every IPv4 and IPv6 address of this host's interfaces, as `getifaddrs(3)` lists them.
///
/// # Errors
/// When the kernel cannot list them.
pub fn addresses() -> io::Result<Vec<InterfaceAddress>> {
    let listed = getifaddrs().map_err(io::Error::from)?;
    Ok(listed
        .filter_map(|entry| {
            let storage = entry.address?;
            let address = if let Some(v4) = storage.as_sockaddr_in() {
                IpAddr::V4(v4.ip())
            } else {
                IpAddr::V6(storage.as_sockaddr_in6()?.ip())
            };
            Some(InterfaceAddress {
                interface: entry.interface_name,
                address,
            })
        })
        .collect())
}

/// The interface of this host that holds `address`, if one does.
///
/// # Errors
/// When the kernel cannot list the interfaces.
pub fn interface_holding(address: IpAddr) -> io::Result<Option<String>> {
    Ok(addresses()?
        .into_iter()
        .find(|held| held.address == address)
        .map(|held| held.interface))
}

/// The address this host sends from toward `target`: the kernel's route, found with an
/// unconnected UDP socket (nothing is sent).
///
/// # Errors
/// When there is no route to `target` (`ENETUNREACH`), or no socket can be made.
pub fn source_toward(target: IpAddr) -> io::Result<IpAddr> {
    let any = match target {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    };
    let socket = UdpSocket::bind((any, 0))?;
    socket.connect((target, 9))?;
    Ok(socket.local_addr()?.ip())
}

/// The addresses `host` names: itself when it is an IP address, else what the resolver
/// says (IPv4 first).
///
/// # Errors
/// When the name does not resolve.
pub fn resolve(host: &str) -> io::Result<Vec<IpAddr>> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(vec![ip]);
    }
    let mut addresses: Vec<IpAddr> = (host, 0).to_socket_addrs()?.map(|a| a.ip()).collect();
    addresses.sort_by_key(IpAddr::is_ipv6);
    addresses.dedup();
    if addresses.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("`{host}` resolves to no address"),
        ));
    }
    Ok(addresses)
}

/// The address the driver listens on and tells its agents, given the addresses (or names)
/// the nodes are known by: the one this host sends from toward the first node that resolves
/// and is routed; without one, the address this host's name resolves to (not loopback
/// where it can), else loopback. Resolves names: call it off the async threads.
pub fn advertise_toward<'a>(nodes: impl IntoIterator<Item = &'a str>) -> IpAddr {
    for node in nodes {
        let Ok(targets) = resolve(node) else {
            continue;
        };
        if let Some(source) = targets.into_iter().find_map(|ip| source_toward(ip).ok()) {
            return source;
        }
    }
    let loopback = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let Some(name) = nix::unistd::gethostname()
        .ok()
        .and_then(|name| name.into_string().ok())
    else {
        return loopback;
    };
    let named = resolve(&name).unwrap_or_default();
    named
        .iter()
        .find(|ip| ip.is_ipv4() && !ip.is_loopback())
        .or_else(|| named.iter().find(|ip| ip.is_ipv4()))
        .copied()
        .unwrap_or(loopback)
}

/// The interface a rank's collectives go through on this host: the one that holds
/// `node_address` (the address the rank's node is known by), else the one of this host's
/// route toward `driver` (`host:port` or a host); `None` when neither can be told.
#[must_use]
pub fn interface_for(node_address: &str, driver: Option<&str>) -> Option<String> {
    let held = addresses().ok()?;
    let holding = |ip: IpAddr| {
        held.iter()
            .find(|a| a.address == ip)
            .map(|a| a.interface.clone())
    };
    if let Some(found) = resolve(node_address)
        .unwrap_or_default()
        .into_iter()
        .find_map(holding)
    {
        return Some(found);
    }
    let driver = driver?;
    let host = driver
        .parse::<SocketAddr>()
        .map(|a| a.ip().to_string())
        .unwrap_or_else(|_| driver.to_owned());
    resolve(&host)
        .ok()?
        .into_iter()
        .find_map(|ip| source_toward(ip).ok())
        .and_then(holding)
}

/// What [`probe`] found: the address it tried, the interface it went out through, and
/// whether anything answered.
#[derive(Debug)]
pub struct Probe {
    /// The address the host resolved to, when it resolved.
    pub address: Option<IpAddr>,
    /// The interface of this host's route toward it, when there is one.
    pub interface: Option<String>,
    /// `Ok` when something answered (a refusal too); else why not.
    pub outcome: Result<(), ProbeError>,
}

/// Why a host cannot be reached.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProbeError {
    /// The name resolves to no address.
    #[error("it resolves to no address")]
    NoAddress(#[source] io::Error),
    /// There is no route to it, or the kernel says it cannot be reached (`ENETUNREACH`,
    /// `EHOSTUNREACH`).
    #[error("no route to it")]
    NoRoute(#[source] io::Error),
    /// Nothing answered within the bound (packets lost on the way: a link down, a
    /// firewall that drops).
    #[error("no answer within {} s", within.as_secs_f64())]
    NoAnswer {
        /// The bound.
        within: Duration,
    },
    /// The connection failed otherwise.
    #[error("the connection failed")]
    Failed(#[source] io::Error),
}

/// Tries a TCP connection to `host:port` for at most `within` (blocking: call it off the
/// async threads). An accepted connection is closed at once; a refusal counts as an answer
/// (the host is there; nothing listens yet).
#[must_use]
pub fn probe(host: &str, port: u16, within: Duration) -> Probe {
    let address = match resolve(host) {
        Ok(addresses) => addresses[0],
        Err(error) => {
            return Probe {
                address: None,
                interface: None,
                outcome: Err(ProbeError::NoAddress(error)),
            };
        }
    };
    let interface = match source_toward(address) {
        Ok(source) => interface_holding(source).ok().flatten(),
        Err(error) => {
            return Probe {
                address: Some(address),
                interface: None,
                outcome: Err(ProbeError::NoRoute(error)),
            };
        }
    };
    let outcome = match TcpStream::connect_timeout(&SocketAddr::new(address, port), within) {
        Ok(_) => Ok(()),
        Err(error) => match error.kind() {
            io::ErrorKind::ConnectionRefused => Ok(()),
            io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => {
                Err(ProbeError::NoAnswer { within })
            }
            io::ErrorKind::NetworkUnreachable | io::ErrorKind::HostUnreachable => {
                Err(ProbeError::NoRoute(error))
            }
            _ => Err(ProbeError::Failed(error)),
        },
    };
    Probe {
        address: Some(address),
        interface,
        outcome,
    }
}

/// Where [`free_port`] chooses: below Linux's default ephemeral range (32768–60999) and
/// above Ray's default worker ports (10002–19999).
const RENDEZVOUS_PORTS: std::ops::RangeInclusive<u16> = 20_000..=29_999;

/// How many ports of [`RENDEZVOUS_PORTS`] [`free_port`] tries before it asks the kernel.
const RENDEZVOUS_TRIES: usize = 32;

/// A port that every address of `ip`'s family on this host (`0.0.0.0` or `::`, as torch's
/// store listens) can be bound to now, for a process started later to listen on: rank 0's
/// `MASTER_PORT`, a worker's address.
///
/// It is released before it is returned, and a torch rank binds it only once it has imported
/// torch (seconds on a loaded host). A port the kernel picks (`bind` to port 0) comes from
/// its ephemeral range (`net.ipv4.ip_local_port_range`), which every outgoing connection and
/// every other such listener on the host draws from meanwhile: on a busy host one of them
/// takes it, and the rank fails with `EADDRINUSE`. So the port is chosen at random in
/// 20000–29999, less the ephemeral range and the ports the host reserves
/// (`net.ipv4.ip_local_reserved_ports`), where only a process that names its port itself can
/// take it; the kernel picks only when none of the ports tried there is free.
///
/// # Errors
/// When no port can be bound at all.
pub fn free_port(ip: IpAddr) -> io::Result<u16> {
    let any = if ip.is_ipv6() {
        IpAddr::V6(Ipv6Addr::UNSPECIFIED)
    } else {
        IpAddr::V4(Ipv4Addr::UNSPECIFIED)
    };
    let ephemeral = ephemeral_ports();
    let reserved = read_ports("/proc/sys/net/ipv4/ip_local_reserved_ports", port_list);
    let taken = |port: u16| {
        ephemeral
            .iter()
            .chain(&reserved)
            .any(|range| range.contains(&port))
    };
    let span = u64::from(RENDEZVOUS_PORTS.end() - RENDEZVOUS_PORTS.start()) + 1;
    for _ in 0..RENDEZVOUS_TRIES {
        let offset = u16::try_from(random() % span).unwrap_or(0);
        let port = RENDEZVOUS_PORTS.start() + offset;
        if !taken(port) && std::net::TcpListener::bind((any, port)).is_ok() {
            return Ok(port);
        }
    }
    Ok(std::net::TcpListener::bind((any, 0))?.local_addr()?.port())
}

/// The kernel's ephemeral ports (`ip_local_port_range`: `32768\t60999`); none when unknown.
fn ephemeral_ports() -> Vec<std::ops::RangeInclusive<u16>> {
    read_ports("/proc/sys/net/ipv4/ip_local_port_range", |text| {
        let mut bounds = text.split_whitespace().map(str::parse::<u16>);
        match (bounds.next(), bounds.next()) {
            (Some(Ok(low)), Some(Ok(high))) => vec![low..=high],
            _ => Vec::new(),
        }
    })
}

/// The port ranges the file at `path` lists, read by `parse`; none when it cannot be read.
fn read_ports(
    path: &str,
    parse: impl Fn(&str) -> Vec<std::ops::RangeInclusive<u16>>,
) -> Vec<std::ops::RangeInclusive<u16>> {
    std::fs::read_to_string(path)
        .map(|text| parse(&text))
        .unwrap_or_default()
}

/// `8080,9000-9010`, as `ip_local_reserved_ports` lists ports; what does not read as ports
/// is left out.
fn port_list(text: &str) -> Vec<std::ops::RangeInclusive<u16>> {
    text.trim()
        .split(',')
        .filter_map(|item| {
            let (low, high) = item.split_once('-').unwrap_or((item, item));
            Some(low.trim().parse().ok()?..=high.trim().parse().ok()?)
        })
        .collect()
}

/// A random number: from the standard library's randomly keyed hasher, whose keys differ on
/// each call.
fn random() -> u64 {
    use std::hash::BuildHasher as _;
    std::hash::RandomState::new().hash_one(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    const LOOPBACK: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

    #[test]
    fn loopback_is_held_by_lo_and_routed_from_itself() {
        assert_eq!(
            interface_holding(LOOPBACK).expect("interfaces"),
            Some("lo".to_owned())
        );
        assert_eq!(source_toward(LOOPBACK).expect("a route"), LOOPBACK);
        assert_eq!(interface_for("127.0.0.1", None), Some("lo".to_owned()));
        assert_eq!(advertise_toward(["127.0.0.1"]), LOOPBACK);
    }

    #[test]
    fn an_address_no_interface_holds_goes_through_the_route_toward_the_driver() {
        // 192.0.2.0/24 is for documentation: no host holds it.
        assert_eq!(interface_for("192.0.2.77", None), None);
        assert_eq!(
            interface_for("192.0.2.77", Some("127.0.0.1:4000")),
            Some("lo".to_owned())
        );
    }

    #[test]
    fn a_refusal_is_an_answer_and_a_name_that_does_not_resolve_is_not() {
        let listener = TcpListener::bind((LOOPBACK, 0)).expect("a port");
        let open = listener.local_addr().expect("its address").port();
        let probed = probe("127.0.0.1", open, Duration::from_secs(3));
        assert!(probed.outcome.is_ok(), "{probed:?}");
        assert_eq!(probed.interface.as_deref(), Some("lo"));
        drop(listener);
        let closed = probe("127.0.0.1", open, Duration::from_secs(3));
        assert!(closed.outcome.is_ok(), "refused, so reachable: {closed:?}");
        let nowhere = probe("no-such-host.invalid", 80, Duration::from_secs(3));
        assert!(
            matches!(nowhere.outcome, Err(ProbeError::NoAddress(_))),
            "{nowhere:?}"
        );
        assert_eq!(nowhere.address, None);
    }

    #[test]
    fn a_free_port_is_out_of_the_ephemeral_range_and_can_be_bound() {
        let ephemeral = ephemeral_ports();
        assert!(!ephemeral.is_empty(), "the ephemeral range is read");
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..20 {
            let port = free_port(LOOPBACK).expect("a port");
            assert!(
                ephemeral.iter().all(|range| !range.contains(&port)),
                "{port} is in the ephemeral range {ephemeral:?}"
            );
            if ephemeral.iter().all(|range| !range.contains(&20_000)) {
                assert!(RENDEZVOUS_PORTS.contains(&port), "{port}");
            }
            let listener = TcpListener::bind((Ipv4Addr::UNSPECIFIED, port)).expect("it binds");
            drop(listener);
            seen.insert(port);
        }
        assert!(seen.len() > 1, "always {seen:?}: not chosen at random");
    }

    #[test]
    fn reserved_ports_read_as_ranges() {
        assert_eq!(
            port_list("8080,9000-9010\n"),
            vec![8080..=8080, 9000..=9010]
        );
        assert_eq!(port_list(""), Vec::new());
        assert_eq!(port_list("x,22"), vec![22..=22]);
    }

    #[test]
    fn names_resolve_ipv4_first_and_literals_as_themselves() {
        assert_eq!(
            resolve("10.1.2.3").expect("a literal"),
            ["10.1.2.3".parse::<IpAddr>().expect("ip")]
        );
        let local = resolve("localhost").expect("localhost resolves");
        assert!(local[0].is_ipv4(), "{local:?}");
    }
}
