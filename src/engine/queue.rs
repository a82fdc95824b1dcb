//! Queue by key: a batch's commands in one queue per key, in arrival order, and a slot for
//! every item's result. Rejected items (not commands) get their result at once.

use std::collections::VecDeque;

use super::processed::rejected;
use super::{Item, ItemResult};
use crate::envelope::Command;

/// A command of the batch, as queued under its key.
#[derive(Debug, Clone, Copy)]
pub(super) struct Head<'a> {
    /// The queue of its key.
    pub(super) queue: usize,
    /// Its index in the batch.
    pub(super) index: usize,
    /// The command.
    pub(super) command: &'a Command,
}

/// A batch being worked: what is left of each key's queue, and the results so far.
pub(super) struct KeyQueues<'a> {
    items: &'a [Item],
    /// One queue per key, in order of the key's first appearance.
    queues: Vec<VecDeque<Head<'a>>>,
    /// One slot per item; `None` until the item is finished.
    results: Vec<Option<ItemResult>>,
}

impl<'a> KeyQueues<'a> {
    /// Queues the commands of `items` by key; rejections are finished at once.
    pub(super) fn new(items: &'a [Item]) -> KeyQueues<'a> {
        let mut results: Vec<Option<ItemResult>> = vec![None; items.len()];
        let mut queues: Vec<VecDeque<Head<'a>>> = Vec::new();
        let mut queue_of: foldhash::HashMap<&str, usize> = foldhash::HashMap::default();
        for (index, item) in items.iter().enumerate() {
            match &item.parsed {
                Err(rejection) => results[index] = Some(ItemResult::Done(Box::new(rejected(item, rejection)))),
                Ok(command) => {
                    let queue = *queue_of.entry(command.key.as_str()).or_insert_with(|| {
                        queues.push(VecDeque::new());
                        queues.len() - 1
                    });
                    queues[queue].push_back(Head { queue, index, command });
                }
            }
        }
        KeyQueues { items, queues, results }
    }

    /// The batch's items.
    pub(super) fn items(&self) -> &'a [Item] {
        self.items
    }

    /// The oldest unfinished command of each key, for at most `max` keys (in order of the
    /// keys' first appearance).
    pub(super) fn heads(&self, max: usize) -> Vec<Head<'a>> {
        self.queues.iter().filter_map(|q| q.front().copied()).take(max).collect()
    }

    /// Finishes `head` (the front of its queue) with `result`; its key's next command
    /// becomes the head.
    pub(super) fn finish(&mut self, head: Head<'a>, result: ItemResult) {
        self.results[head.index] = Some(result);
        self.queues[head.queue].pop_front();
    }

    /// One result per item; an item never finished (the batch was cancelled) is abandoned.
    pub(super) fn into_results(self) -> Vec<ItemResult> {
        self.results.into_iter().map(|r| r.unwrap_or(ItemResult::Abandoned)).collect()
    }
}
