//! Tickets: what a command needs to start its sink call at once (the sink's circuit closed
//! or its probe turn, a `max_in_flight` permit, the sink's concurrency permit and rate
//! token), taken *before* its claim is written. A durable claim is then a call that can
//! begin as soon as the claim is synced, so a crash leaves few claims whose sink never saw
//! a call (for a sink that does not forward the key, each is an `indeterminate` key for an
//! operator), and claims out never exceed the calls that can run.
//!
//! A round takes a ticket for each head to claim as it decides it (`start`), in order: it
//! waits for the first, and takes each other one only if it is there at once; at the first
//! head without a ticket the round stops, and that head is let go and decided again next
//! round. Only the first is waited for, while the round holds no ticket, so partitions never
//! wait on each other's tickets. A round that carries the previous round's completions waits
//! for none (those completions must not wait for other partitions' sink calls to free a
//! permit).

use tokio::sync::SemaphorePermit;
use tokio_util::sync::CancellationToken;

use super::Engine;
use crate::envelope::Command;
use crate::sinks::{Reservation, Sink};

/// What one call needs to start, held from before its claim until the call ends.
pub(super) struct Ticket<'e> {
    /// The `max_in_flight` permit.
    pub(super) permit: SemaphorePermit<'e>,
    /// The sink's admission and limits.
    pub(super) reservation: Reservation<'e>,
}

impl Engine {
    /// A ticket for the first call of `command`, waiting for it with `wait`, else only if
    /// it is there at once. `None` without one, or when `cancel` fires while waiting.
    pub(super) async fn ticket_for(
        &self,
        command: &Command,
        wait: bool,
        cancel: &CancellationToken,
    ) -> Option<Ticket<'_>> {
        let sink = self.route_sinks[command.route].as_ref();
        match wait {
            true => self.wait_ticket(sink, &command.key, cancel).await,
            false => self.try_ticket(sink, &command.key),
        }
    }

    /// A ticket for a call of `sink` for `key` if everything is there now.
    fn try_ticket<'s>(&'s self, sink: &'s Sink, key: &str) -> Option<Ticket<'s>> {
        let permit = self.limiter.try_acquire().ok()?;
        let reservation = sink.try_reserve(key)?;
        Some(Ticket { permit, reservation })
    }

    /// Waits for a ticket: the circuit first, holding nothing (so commands of healthy sinks
    /// keep their permits), then a permit, then the sink's limits. `None` when `cancel`
    /// fires first.
    async fn wait_ticket<'s>(&'s self, sink: &'s Sink, key: &str, cancel: &CancellationToken) -> Option<Ticket<'s>> {
        let wait = async {
            let admission = sink.admit(key).await;
            // The semaphore is never closed: `None` cannot happen.
            let permit = self.limiter.acquire().await.ok()?;
            let reservation = sink.reserve_limits(admission).await.ok()?;
            Some(Ticket { permit, reservation })
        };
        tokio::select! {
            biased;
            () = cancel.cancelled() => None,
            ticket = wait => ticket,
        }
    }
}
