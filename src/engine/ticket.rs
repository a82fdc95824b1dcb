//! Tickets: what a command needs to start its sink call at once (the sink's circuit closed
//! or its probe turn, a `max_in_flight` permit, the sink's concurrency permit and rate
//! token), taken *before* its claim is written. A durable claim is then a call that can
//! begin as soon as the claim is synced, so a crash leaves few claims whose sink never saw
//! a call (for a sink that does not forward the key, each is an `indeterminate` key for an
//! operator), and claims out never exceed the calls that can run.
//!
//! A round takes a ticket for each head to claim, in order: it waits for the first, and
//! takes each other one only if it is there at once; heads without a ticket are let go and
//! decided again next round. Only the first is waited for, while the round holds no ticket,
//! so partitions never wait on each other's tickets. A round that carries the previous
//! round's completions waits for none (those completions must not wait for other
//! partitions' sink calls to free a permit).

use tokio::sync::SemaphorePermit;
use tokio_util::sync::CancellationToken;

use super::Engine;
use super::start::ToClaim;
use crate::sinks::{Reservation, Sink};

/// What one call needs to start, held from before its claim until the call ends.
pub(super) struct Ticket<'e> {
    /// The `max_in_flight` permit.
    pub(super) permit: SemaphorePermit<'e>,
    /// The sink's admission and limits.
    pub(super) reservation: Reservation<'e>,
}

impl Engine {
    /// A ticket for each head of `to_claim` that can have one (see the module doc), waiting
    /// for the first with `wait_first`; the keys of the others are let go. Empty when
    /// `cancel` fires while waiting.
    pub(super) async fn take_tickets<'a>(
        &'a self,
        to_claim: Vec<ToClaim<'a>>,
        wait_first: bool,
        cancel: &CancellationToken,
    ) -> Vec<(ToClaim<'a>, Ticket<'a>)> {
        let mut ready: Vec<(ToClaim<'a>, Ticket<'a>)> = Vec::with_capacity(to_claim.len());
        for t in to_claim {
            let sink = self.route_sinks[t.head.command.route].as_ref();
            let key = t.head.command.key.as_str();
            let ticket = match wait_first && ready.is_empty() {
                true => self.wait_ticket(sink, key, cancel).await,
                false => self.try_ticket(sink, key),
            };
            match ticket {
                Some(ticket) => ready.push((t, ticket)),
                None => {
                    // Not claimed: its head stays first in its queue for the next round.
                    self.inflight.lock().remove(key);
                }
            }
        }
        ready
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
