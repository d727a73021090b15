//! Admission of connections that have not authenticated yet, shared by the driver's hub and
//! a task's report socket.
//!
//! A listener that serves only authenticated peers still has to accept a connection before
//! it can tell: until its first message is checked, the connection holds a slot (a task and
//! a socket). If new connections were refused once every slot is taken, anyone who can
//! reach the port could hold every slot with idle connections and keep real peers out
//! (renewing them whenever they time out). Here the newest connection is always admitted,
//! and when a cap is reached the *oldest* pending connection is evicted instead, the way
//! sshd's `MaxStartups` does: a real peer sends its first message as soon as it connects and
//! leaves the queue the moment it authenticates, so only a flood of newer connections within
//! that short time can push it out, while idle connections age out first. Connections that
//! have sent nothing yet are evicted before any that has (see [`Queue::spoke`]), and a TCP
//! connection is looked at before it is evicted as silent ([`Gate::enter_tcp`]): once a real
//! peer's first bytes have arrived, idle connections cannot push it out, however fast they
//! come. What remains is the moment between its connect and its first write.
//!
//! Pending connections are capped globally and per peer (its IP address): a flood from one
//! host evicts its own connections first and never more than its share of the queue.
//! Authenticated connections are not counted here: a listener caps them on its own.
//!
//! [`Queue`] is the bookkeeping alone, synchronous and free of I/O; [`Gate`] shares one
//! among a listener's connection tasks and tells an evicted connection's task to stop
//! through its [`Ticket`].
//!
//! ```
//! use std::net::{IpAddr, Ipv4Addr};
//! use trainyard_wire::admission::{Limits, Queue};
//!
//! let peer = IpAddr::V4(Ipv4Addr::LOCALHOST);
//! let mut queue = Queue::new(Limits::new(2, 2));
//! let (first, evicted) = queue.admit(peer, "first");
//! assert_eq!(evicted, None);
//! let (_second, _) = queue.admit(peer, "second");
//! // Full: the newest is admitted, the oldest goes.
//! let (_third, evicted) = queue.admit(peer, "third");
//! assert_eq!(evicted, Some((peer, "first")));
//! assert_eq!(queue.remove(first), None);
//! assert_eq!(queue.len(), 2);
//! ```

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::future::Future;
use std::hash::Hash;
use std::os::fd::AsFd as _;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio_util::sync::CancellationToken;

/// How many connections may wait to authenticate at once: in all, and from one peer. Each
/// is at least 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Limits {
    /// Pending connections in all.
    pub global: usize,
    /// Pending connections from one peer.
    pub per_peer: usize,
}

impl Limits {
    /// `global` pending connections in all, `per_peer` from one peer; a cap of 0 counts as
    /// 1 (the newest connection is always admitted).
    #[must_use]
    pub const fn new(global: usize, per_peer: usize) -> Self {
        Self {
            global: if global == 0 { 1 } else { global },
            per_peer: if per_peer == 0 { 1 } else { per_peer },
        }
    }
}

/// A pending connection's place in a [`Queue`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PendingId(u64);

/// The connections waiting to authenticate, oldest first, each with its peer and a value of
/// the caller's (what stops its task, say). Admitting one beyond a cap evicts the oldest:
/// of the same peer when that peer is at [`Limits::per_peer`], else of all. Connections that
/// have sent nothing yet go first: a real peer speaks as soon as it connects (see
/// [`Queue::spoke`]), an idle one never does, so idle connections are evicted before any
/// that is in the middle of its handshake.
#[derive(Debug)]
pub struct Queue<P, T> {
    limits: Limits,
    next: u64,
    entries: HashMap<PendingId, Entry<P, T>>,
    all: Ages,
    by_peer: HashMap<P, Ages>,
}

#[derive(Debug)]
struct Entry<P, T> {
    peer: P,
    value: T,
    spoke: bool,
}

/// Pending ids by age (ids grow with every admission): those that have sent nothing yet,
/// and those that have.
#[derive(Debug, Default)]
struct Ages {
    silent: BTreeSet<PendingId>,
    spoke: BTreeSet<PendingId>,
}

impl Ages {
    fn len(&self) -> usize {
        self.silent.len() + self.spoke.len()
    }

    /// The one to evict: the oldest silent one, else the oldest.
    fn first_to_go(&self) -> Option<PendingId> {
        self.silent.first().or_else(|| self.spoke.first()).copied()
    }

    fn side(&mut self, spoke: bool) -> &mut BTreeSet<PendingId> {
        if spoke {
            &mut self.spoke
        } else {
            &mut self.silent
        }
    }
}

impl<P: Eq + Hash + Clone, T> Queue<P, T> {
    /// An empty queue with these caps.
    #[must_use]
    pub fn new(limits: Limits) -> Self {
        Self {
            limits: Limits::new(limits.global, limits.per_peer),
            next: 0,
            entries: HashMap::new(),
            all: Ages::default(),
            by_peer: HashMap::new(),
        }
    }

    /// Admits a new connection from `peer`, always; returns its id and the connection it
    /// evicted to make room, if a cap was reached (its peer and value).
    pub fn admit(&mut self, peer: P, value: T) -> (PendingId, Option<(P, T)>) {
        self.admit_asking(peer, value, |_| false)
    }

    /// As [`Queue::admit`], asking `has_spoken` of each silent connection before it is
    /// evicted whether it has sent something meanwhile (what its task has not seen yet): one
    /// that has is noted as [spoken](Queue::spoke), and the next is asked.
    pub fn admit_asking(
        &mut self,
        peer: P,
        value: T,
        mut has_spoken: impl FnMut(&T) -> bool,
    ) -> (PendingId, Option<(P, T)>) {
        let evicted = self
            .victim(&peer, &mut has_spoken)
            .and_then(|id| self.take(id));
        let id = PendingId(self.next);
        self.next += 1;
        self.by_peer
            .entry(peer.clone())
            .or_default()
            .silent
            .insert(id);
        self.all.silent.insert(id);
        self.entries.insert(
            id,
            Entry {
                peer,
                value,
                spoke: false,
            },
        );
        (id, evicted)
    }

    /// The connection to evict to admit one more of `peer`, if a cap is reached.
    fn victim(&mut self, peer: &P, has_spoken: &mut impl FnMut(&T) -> bool) -> Option<PendingId> {
        loop {
            let of_peer = self
                .by_peer
                .get(peer)
                .filter(|ages| ages.len() >= self.limits.per_peer)
                .and_then(Ages::first_to_go);
            let id = of_peer.or_else(|| {
                (self.all.len() >= self.limits.global)
                    .then(|| self.all.first_to_go())
                    .flatten()
            })?;
            match self.entries.get(&id) {
                // Each turn notes one more as spoken: the loop ends.
                Some(entry) if !entry.spoke && has_spoken(&entry.value) => self.spoke(id),
                _ => return Some(id),
            }
        }
    }

    /// Notes that the connection `id` has sent something (its handshake has begun): from
    /// now on every silent connection goes before it. It keeps its age.
    pub fn spoke(&mut self, id: PendingId) {
        let Some(entry) = self.entries.get_mut(&id) else {
            return;
        };
        if entry.spoke {
            return;
        }
        entry.spoke = true;
        for ages in [Some(&mut self.all), self.by_peer.get_mut(&entry.peer)]
            .into_iter()
            .flatten()
        {
            ages.silent.remove(&id);
            ages.spoke.insert(id);
        }
    }

    /// Takes a connection out (it authenticated, or it ended); its value, or `None` when it
    /// was evicted or removed already.
    pub fn remove(&mut self, id: PendingId) -> Option<T> {
        self.take(id).map(|(_, value)| value)
    }

    fn take(&mut self, id: PendingId) -> Option<(P, T)> {
        let entry = self.entries.remove(&id)?;
        self.all.side(entry.spoke).remove(&id);
        if let Some(ages) = self.by_peer.get_mut(&entry.peer) {
            ages.side(entry.spoke).remove(&id);
            if ages.len() == 0 {
                self.by_peer.remove(&entry.peer);
            }
        }
        Some((entry.peer, entry.value))
    }

    /// How many connections are pending.
    #[must_use]
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no connection is pending.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// How many connections of `peer` are pending.
    #[must_use]
    pub fn pending_of(&self, peer: &P) -> usize {
        self.by_peer.get(peer).map_or(0, Ages::len)
    }

    /// Whether the connection `id` is still pending.
    #[must_use]
    pub fn contains(&self, id: PendingId) -> bool {
        self.entries.contains_key(&id)
    }
}

/// A [`Queue`] shared by a listener and its connection tasks: [`Gate::enter`] admits a new
/// connection and stops the task of the one it evicts. Cheap to clone: clones share the
/// queue.
pub struct Gate<P> {
    queue: Arc<Mutex<Queue<P, Waiting>>>,
}

/// What a [`Gate`] keeps of a pending connection.
struct Waiting {
    /// Stops its task.
    evict: CancellationToken,
    /// Its socket (a duplicate descriptor), to look for bytes its task has not read yet.
    socket: Option<std::net::TcpStream>,
}

impl Waiting {
    /// Whether bytes wait on the socket: its peer has spoken, though its task may not have
    /// seen it yet.
    fn has_spoken(&self) -> bool {
        // The socket is non-blocking (tokio's, whose descriptor this duplicates).
        self.socket
            .as_ref()
            .is_some_and(|socket| matches!(socket.peek(&mut [0u8; 1]), Ok(1..)))
    }
}

impl<P> Clone for Gate<P> {
    fn clone(&self) -> Self {
        Self {
            queue: Arc::clone(&self.queue),
        }
    }
}

impl<P> fmt::Debug for Gate<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let queue = lock(&self.queue);
        f.debug_struct("Gate")
            .field("limits", &queue.limits)
            .field("pending", &queue.entries.len())
            .finish()
    }
}

impl<P: Eq + Hash + Clone> Gate<P> {
    /// A gate with these caps.
    #[must_use]
    pub fn new(limits: Limits) -> Self {
        Self {
            queue: Arc::new(Mutex::new(Queue::new(limits))),
        }
    }

    /// Admits a new connection from `peer`; when a cap is reached, the oldest pending one
    /// (of `peer` first, see [`Queue`]) is told to stop. The connection stays pending until
    /// its ticket is dropped or [`Ticket::authenticated`].
    #[must_use]
    pub fn enter(&self, peer: P) -> Ticket<P> {
        self.admit(peer, None)
    }

    /// As [`Gate::enter`] for a TCP connection: before it is evicted while silent, its
    /// socket is looked at, and if its peer has sent something meanwhile (before its task
    /// could note it with [`Ticket::spoke`]), it is noted as spoken and kept. A real peer
    /// that spoke at once is so kept however fast newer connections arrive.
    #[must_use]
    pub fn enter_tcp(&self, peer: P, socket: &tokio::net::TcpStream) -> Ticket<P> {
        let duplicate = socket.as_fd().try_clone_to_owned().ok();
        self.admit(peer, duplicate.map(std::net::TcpStream::from))
    }

    fn admit(&self, peer: P, socket: Option<std::net::TcpStream>) -> Ticket<P> {
        let evict = CancellationToken::new();
        let waiting = Waiting {
            evict: evict.clone(),
            socket,
        };
        let (id, evicted) = lock(&self.queue).admit_asking(peer, waiting, Waiting::has_spoken);
        if let Some((_, evicted)) = evicted {
            evicted.evict.cancel();
        }
        Ticket {
            gate: self.clone(),
            id,
            evict,
        }
    }

    /// How many connections are pending.
    #[must_use]
    pub fn pending(&self) -> usize {
        lock(&self.queue).len()
    }
}

/// A connection's place in a [`Gate`] while it has not authenticated: dropping it, or
/// [`Ticket::authenticated`], takes it out.
pub struct Ticket<P: Eq + Hash + Clone> {
    gate: Gate<P>,
    id: PendingId,
    evict: CancellationToken,
}

impl<P: Eq + Hash + Clone> Ticket<P> {
    /// Runs `work` (reading and checking the connection's first message) until it ends, or
    /// until the connection is evicted: `None` then, and `work` is dropped with the socket
    /// it owns, which closes it.
    pub async fn run<F: Future>(&self, work: F) -> Option<F::Output> {
        tokio::select! {
            biased;
            () = self.evict.cancelled() => None,
            done = work => Some(done),
        }
    }

    /// Notes that the connection has sent something: see [`Queue::spoke`].
    pub fn spoke(&self) {
        lock(&self.gate.queue).spoke(self.id);
    }

    /// Whether a newer connection evicted this one.
    #[must_use]
    pub fn is_evicted(&self) -> bool {
        self.evict.is_cancelled()
    }

    /// The connection authenticated: it is no longer pending, and no newer connection can
    /// evict it.
    pub fn authenticated(self) {
        drop(self);
    }
}

impl<P: Eq + Hash + Clone> Drop for Ticket<P> {
    fn drop(&mut self) {
        lock(&self.gate.queue).remove(self.id);
    }
}

impl<P: Eq + Hash + Clone> fmt::Debug for Ticket<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ticket")
            .field("id", &self.id)
            .field("evicted", &self.is_evicted())
            .finish()
    }
}

/// Locks the queue; every update under it is finished before it is let go, so a lock
/// poisoned by a panic elsewhere is used as it is.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};
    use std::time::Duration;

    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(10, 0, 0, last))
    }

    #[test]
    fn a_full_queue_admits_the_newest_and_evicts_the_oldest() {
        let mut queue = Queue::new(Limits::new(3, 3));
        let first = queue.admit(ip(1), 1).0;
        let second = queue.admit(ip(2), 2).0;
        let third = queue.admit(ip(3), 3).0;
        let (fourth, evicted) = queue.admit(ip(4), 4);
        assert_eq!(evicted, Some((ip(1), 1)));
        let (_, evicted) = queue.admit(ip(5), 5);
        assert_eq!(evicted, Some((ip(2), 2)));
        assert_eq!(queue.len(), 3);
        assert!(!queue.contains(first) && !queue.contains(second));
        assert!(queue.contains(third) && queue.contains(fourth));
    }

    #[test]
    fn a_peer_at_its_cap_evicts_its_own_oldest_not_anyone_elses() {
        let mut queue = Queue::new(Limits::new(10, 2));
        let honest = queue.admit(ip(9), "honest").0;
        queue.admit(ip(1), "flood-0");
        queue.admit(ip(1), "flood-1");
        for n in 2..100 {
            let (_, evicted) = queue.admit(ip(1), "flood");
            let (peer, _) = evicted.expect("the flooding peer is at its cap");
            assert_eq!(peer, ip(1), "connection {n} evicted another peer's");
        }
        assert_eq!(queue.pending_of(&ip(1)), 2);
        assert!(
            queue.contains(honest),
            "the older connection of another peer stays"
        );
        assert_eq!(queue.len(), 3);
    }

    #[test]
    fn below_its_own_cap_a_peer_evicts_the_oldest_of_all_once_the_queue_is_full() {
        let mut queue = Queue::new(Limits::new(3, 2));
        queue.admit(ip(1), "a");
        queue.admit(ip(2), "b");
        queue.admit(ip(2), "c");
        let (_, evicted) = queue.admit(ip(3), "d");
        assert_eq!(evicted, Some((ip(1), "a")));
        assert_eq!(queue.pending_of(&ip(1)), 0);
        // ip(2) is at its cap: its own oldest goes, though ip(3)'s is as old.
        let (_, evicted) = queue.admit(ip(2), "e");
        assert_eq!(evicted, Some((ip(2), "b")));
    }

    #[test]
    fn an_authenticated_connection_leaves_and_frees_its_place() {
        let mut queue = Queue::new(Limits::new(2, 2));
        let first = queue.admit(ip(1), 1).0;
        let second = queue.admit(ip(1), 2).0;
        assert_eq!(queue.remove(first), Some(1));
        assert_eq!(queue.remove(first), None, "removed once");
        let (_, evicted) = queue.admit(ip(1), 3);
        assert_eq!(evicted, None, "the freed place is taken without evicting");
        let (_, evicted) = queue.admit(ip(1), 4);
        assert_eq!(evicted, Some((ip(1), 2)));
        assert_eq!(
            queue.remove(second),
            None,
            "an evicted connection is gone already"
        );
        assert_eq!(queue.pending_of(&ip(1)), 2);
    }

    #[test]
    fn connections_that_sent_nothing_go_before_older_ones_that_spoke() {
        let mut queue = Queue::new(Limits::new(3, 2));
        let agent = queue.admit(ip(1), "agent").0;
        queue.spoke(agent);
        queue.admit(ip(1), "idle-1");
        // ip(1) is at its cap: its silent connection goes, not its older one that spoke.
        let (_, evicted) = queue.admit(ip(1), "idle-1b");
        assert_eq!(evicted, Some((ip(1), "idle-1")));
        let other = queue.admit(ip(2), "other").0;
        queue.spoke(other);
        // The queue is full: the oldest silent one of all goes.
        let (_, evicted) = queue.admit(ip(3), "idle-3");
        assert_eq!(evicted, Some((ip(1), "idle-1b")));
        let (_, evicted) = queue.admit(ip(3), "idle-3b");
        assert_eq!(evicted, Some((ip(3), "idle-3")));
        // A flood of idle connections never reaches the two that spoke.
        for _ in 0..100 {
            let (_, evicted) = queue.admit(ip(4), "idle-4");
            assert_ne!(evicted.map(|(_, name)| name), Some("agent"));
        }
        assert!(queue.contains(agent) && queue.contains(other));
        // Once only connections that spoke are left, the oldest of them goes.
        queue.spoke(PendingId(queue.next - 1));
        let (_, evicted) = queue.admit(ip(2), "late");
        assert_eq!(evicted, Some((ip(1), "agent")));
        queue.spoke(agent);
        assert_eq!(queue.len(), 3);
    }

    #[test]
    fn a_silent_connection_found_to_have_spoken_is_kept_and_the_next_goes() {
        let mut queue = Queue::new(Limits::new(3, 3));
        queue.admit(ip(1), ("idle", false));
        let agent = queue.admit(ip(1), ("agent", true)).0;
        queue.admit(ip(1), ("idle", false));
        let spoken = |value: &(&str, bool)| value.1;
        let (_, evicted) = queue.admit_asking(ip(1), ("idle", false), spoken);
        assert_eq!(evicted, Some((ip(1), ("idle", false))));
        // The agent is the oldest now: asked, it has spoken, so the idle one after it goes.
        let (_, evicted) = queue.admit_asking(ip(1), ("idle", false), spoken);
        assert_eq!(evicted, Some((ip(1), ("idle", false))));
        for _ in 0..100 {
            queue.admit_asking(ip(1), ("idle", false), spoken);
        }
        assert!(queue.contains(agent));
    }

    #[tokio::test]
    async fn a_tcp_connection_whose_bytes_wait_unread_is_not_evicted_for_idle_ones() {
        use tokio::io::AsyncWriteExt as _;

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bound");
        let addr = listener.local_addr().expect("an address");
        let gate = Gate::new(Limits::new(4, 4));
        let mut client = tokio::net::TcpStream::connect(addr)
            .await
            .expect("connected");
        client.write_all(b"hello\n").await.expect("sent");
        let (speaking, _) = listener.accept().await.expect("accepted");
        // Let the bytes arrive: the socket is readable once they have.
        tokio::time::timeout(Duration::from_secs(10), speaking.readable())
            .await
            .expect("readable in time")
            .expect("readable");
        // Its task has not noted it: only a look at the socket tells.
        let ticket = gate.enter_tcp(ip(1), &speaking);
        let mut idle = Vec::new();
        for _ in 0..20 {
            let _open = tokio::net::TcpStream::connect(addr)
                .await
                .expect("connected");
            let (socket, _) = listener.accept().await.expect("accepted");
            let silent = gate.enter_tcp(ip(1), &socket);
            idle.push((socket, silent, _open));
        }
        assert!(!ticket.is_evicted());
        assert_eq!(
            idle.iter().filter(|(_, t, _)| t.is_evicted()).count(),
            20 - 3
        );
    }

    #[test]
    fn caps_of_zero_still_admit_the_newest() {
        let mut queue = Queue::new(Limits::new(0, 0));
        let first = queue.admit(ip(1), 1).0;
        let (second, evicted) = queue.admit(ip(1), 2);
        assert_eq!(evicted, Some((ip(1), 1)));
        assert!(!queue.contains(first) && queue.contains(second));
        assert!(!queue.is_empty());
    }

    #[tokio::test]
    async fn an_evicted_tickets_work_is_stopped_and_an_authenticated_one_cannot_be_evicted() {
        let gate = Gate::new(Limits::new(2, 2));
        let oldest = gate.enter(ip(1));
        let authenticated = gate.enter(ip(1));
        authenticated.authenticated();
        assert_eq!(gate.pending(), 1);
        let newer = gate.enter(ip(1));
        assert!(!oldest.is_evicted(), "a place was free");
        let newest = gate.enter(ip(1));
        assert!(oldest.is_evicted());
        assert!(!newer.is_evicted());
        let stopped = tokio::time::timeout(
            Duration::from_secs(10),
            oldest.run(std::future::pending::<()>()),
        )
        .await
        .expect("an evicted ticket's work stops at once");
        assert_eq!(stopped, None);
        assert_eq!(newest.run(async { 7 }).await, Some(7));
        drop((oldest, newer, newest));
        assert_eq!(gate.pending(), 0);
    }
}
