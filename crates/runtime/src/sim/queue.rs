//! An actor's request queue: unbounded, and without a buffer while it is empty, which it
//! mostly is; a large simulated cluster holds one per actor.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use super::lock;

/// A queue: what [`Mailbox::send`] puts in, [`Inbox::recv`] takes out in order.
pub(super) fn queue<T>() -> (Mailbox<T>, Inbox<T>) {
    let shared = Arc::new(Shared {
        items: Mutex::new(Some(VecDeque::new())),
        senders: AtomicUsize::new(1),
        changed: Notify::new(),
    });
    (Mailbox(Arc::clone(&shared)), Inbox(shared))
}

struct Shared<T> {
    /// `None` once the inbox is gone: what was queued is dropped, and sends are refused.
    items: Mutex<Option<VecDeque<T>>>,
    /// Mailboxes alive: with none and nothing queued, the inbox has nothing more to take.
    senders: AtomicUsize,
    /// Something was queued, or the last mailbox went.
    changed: Notify,
}

/// The sending side; clones send to the same queue.
pub(super) struct Mailbox<T>(Arc<Shared<T>>);

impl<T> Mailbox<T> {
    /// Queues `item`; gives it back when the inbox is gone.
    pub(super) fn send(&self, item: T) -> Result<(), T> {
        match lock(&self.0.items).as_mut() {
            Some(items) => items.push_back(item),
            None => return Err(item),
        }
        self.0.changed.notify_one();
        Ok(())
    }
}

impl<T> Clone for Mailbox<T> {
    fn clone(&self) -> Self {
        self.0.senders.fetch_add(1, Ordering::Relaxed);
        Self(Arc::clone(&self.0))
    }
}

impl<T> Drop for Mailbox<T> {
    fn drop(&mut self) {
        if self.0.senders.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.changed.notify_one();
        }
    }
}

/// The receiving side.
pub(super) struct Inbox<T>(Arc<Shared<T>>);

impl<T> Inbox<T> {
    /// The next item; `None` once every mailbox is gone and nothing is queued.
    pub(super) async fn recv(&mut self) -> Option<T> {
        loop {
            if let Some(item) = lock(&self.0.items).as_mut().and_then(VecDeque::pop_front) {
                return Some(item);
            }
            if self.0.senders.load(Ordering::Acquire) == 0 {
                return None;
            }
            // A change before this wait left a permit: it returns at once then.
            self.0.changed.notified().await;
        }
    }
}

impl<T> Drop for Inbox<T> {
    fn drop(&mut self) {
        // Dropped outside the lock: an item may hold what wakes a waiting caller.
        let queued = lock(&self.0.items).take();
        drop(queued);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn items_come_out_in_order_and_then_none_once_every_mailbox_is_gone() {
        let (mailbox, mut inbox) = queue();
        let other = mailbox.clone();
        assert!(mailbox.send(1).is_ok() && other.send(2).is_ok());
        drop(mailbox);
        assert_eq!(inbox.recv().await, Some(1));
        assert_eq!(inbox.recv().await, Some(2));
        let waiting = tokio::spawn(async move { inbox.recv().await });
        tokio::task::yield_now().await;
        drop(other);
        assert_eq!(waiting.await.expect("join"), None);
    }

    #[tokio::test]
    async fn a_send_after_the_inbox_is_gone_is_refused_and_what_was_queued_is_dropped() {
        let (mailbox, inbox) = queue();
        let (reply, answer) = tokio::sync::oneshot::channel::<()>();
        assert!(mailbox.send(Some(reply)).is_ok());
        drop(inbox);
        assert!(answer.await.is_err(), "the queued item was dropped");
        assert!(mailbox.send(None).is_err());
    }
}
