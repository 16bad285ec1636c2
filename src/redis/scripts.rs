//! The server-side scripts, loaded once and run by EVALSHA.

use std::collections::HashMap;

use redis::Script;

/// The Lua functions every script shares (`lua/prelude.lua`): the branded
/// id's text form and the shard-count rule, the same as [`crate::id`]'s and
/// [`crate::keys::is_recorded_count`]. Prepended to each script on load.
pub const LUA_PRELUDE: &str = include_str!("lua/prelude.lua");

/// The server-side scripts, each a Lua file: the stream calls' under
/// `src/redis/lua/`, the consume path's beside their Rust wrappers in `src/consume/`.
#[derive(Clone)]
pub struct Scripts {
    /// `append.lua`: mint branded ids and XADD a batch atomically.
    pub append: Script,
    /// `consume/redeliver.lua`: claim due entries still pending for this consumer.
    pub redeliver: Script,
    /// `consume/refresh.lua`: keep the leases of held entries fresh.
    pub refresh: Script,
    /// `consume/release.lua`: give held entries back to the group, their delivery count restored.
    pub release: Script,
    /// `consume/dead_letter.lua`: move entries to the dead-letter stream.
    pub dead_letter: Script,
    /// `consume/keyed_read.lua`: read new entries of a group with per-key
    /// limits, registering and gating each keyed one in the same step.
    pub keyed_read: Script,
    /// `consume/keys_gate.lua`: which entries waiting for their key (or
    /// reclaimed, or retried) may run now.
    pub keys_gate: Script,
    /// `consume/hygiene.lua`: record this sidecar's heartbeat, remove dead consumers that hold nothing,
    /// sweep a sample of the keyed entries whose entry left the PEL unseen.
    pub hygiene: Script,
    /// `reclaim_probe.lua`: which of many groups have entries to reclaim.
    pub reclaim_probe: Script,
    /// `consume/settle.lua`: a batch of XACKs and retry-state writes in one command.
    pub settle: Script,
    /// `consume/ack_emit.lua`: append a delivery's emits and XACK it, only while it is this consumer's.
    pub ack_emit: Script,
    /// `trim.lua`: XTRIM MINID, never past what groups still need (safe mode).
    pub trim: Script,
    /// `replay.lua`: move dead letters back to their source stream.
    pub replay: Script,
    /// `group_lag.lua`: a group's lag, exact or nil, never Redis 7.0's miscount.
    pub group_lag: Script,
    /// `group_state.lua`: a group's state, its lag as `group_lag`'s, and its
    /// stream's schedule, in one step.
    pub group_state: Script,
    /// `lease_renew.lua`: extend the archive's fold lease while this sidecar holds it.
    pub lease_renew: Script,
    /// `lease_release.lua`: give the archive's fold lease up while this sidecar holds it.
    pub lease_release: Script,
    /// `destroy_group.lua`: XGROUP DESTROY and the group's own keys, in one step.
    pub destroy_group: Script,
    /// `move.lua`: move a stream's due scheduled entries into it, each in one step with its removal.
    pub move_scheduled: Script,
    /// `cancel.lua`: remove one scheduled entry before it is moved.
    pub cancel_scheduled: Script,
    /// `list_scheduled.lua`: a page of a stream's scheduled entries.
    pub list_scheduled: Script,
    /// `due_streams.lua`: the streams whose schedules are due, by Redis time.
    pub due_streams: Script,
}

impl Scripts {
    /// SHA1 → file name of every script, for labelling EVALSHA in metrics.
    pub(super) fn names(&self) -> HashMap<String, &'static str> {
        [
            (&self.append, "append"),
            (&self.redeliver, "redeliver"),
            (&self.refresh, "refresh"),
            (&self.release, "release"),
            (&self.dead_letter, "dead_letter"),
            (&self.keyed_read, "keyed_read"),
            (&self.keys_gate, "keys_gate"),
            (&self.trim, "trim"),
            (&self.settle, "settle"),
            (&self.ack_emit, "ack_emit"),
            (&self.hygiene, "hygiene"),
            (&self.reclaim_probe, "reclaim_probe"),
            (&self.replay, "replay"),
            (&self.group_lag, "group_lag"),
            (&self.group_state, "group_state"),
            (&self.lease_renew, "lease_renew"),
            (&self.lease_release, "lease_release"),
            (&self.destroy_group, "destroy_group"),
            (&self.move_scheduled, "move"),
            (&self.cancel_scheduled, "cancel"),
            (&self.list_scheduled, "list_scheduled"),
            (&self.due_streams, "due_streams"),
        ]
        .into_iter()
        .map(|(script, name)| (script.get_hash().to_owned(), name))
        .collect()
    }

    pub(super) fn new() -> Scripts {
        let script = |body: &str| Script::new(&format!("{LUA_PRELUDE}\n{body}"));
        // The per-key gate's functions, for the scripts that build or check keyed members.
        let keyed = |body: &str| script(&format!("{}\n{body}", include_str!("../consume/key_gate.lua")));
        // The lag rule, for the scripts that report a group's lag.
        let lag = |body: &str| script(&format!("{}\n{body}", include_str!("lua/lag.lua")));
        Scripts {
            append: script(include_str!("lua/append.lua")),
            redeliver: script(include_str!("../consume/redeliver.lua")),
            refresh: script(include_str!("../consume/refresh.lua")),
            release: script(include_str!("../consume/release.lua")),
            dead_letter: keyed(include_str!("../consume/dead_letter.lua")),
            keyed_read: keyed(include_str!("../consume/keyed_read.lua")),
            keys_gate: keyed(include_str!("../consume/keys_gate.lua")),
            trim: script(include_str!("lua/trim.lua")),
            settle: script(include_str!("../consume/settle.lua")),
            ack_emit: script(include_str!("../consume/ack_emit.lua")),
            hygiene: keyed(include_str!("../consume/hygiene.lua")),
            reclaim_probe: script(include_str!("../consume/reclaim_probe.lua")),
            replay: script(include_str!("lua/replay.lua")),
            group_lag: lag(include_str!("lua/group_lag.lua")),
            group_state: lag(include_str!("lua/group_state.lua")),
            lease_renew: script(include_str!("lua/lease_renew.lua")),
            lease_release: script(include_str!("lua/lease_release.lua")),
            destroy_group: script(include_str!("lua/destroy_group.lua")),
            move_scheduled: script(include_str!("lua/move.lua")),
            cancel_scheduled: script(include_str!("lua/cancel.lua")),
            list_scheduled: script(include_str!("lua/list_scheduled.lua")),
            due_streams: script(include_str!("lua/due_streams.lua")),
        }
    }
}
