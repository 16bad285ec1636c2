package echomq

import (
	"context"
	"encoding/hex"
	"fmt"
	"sync"
)

// Delivery is at-least-once: the sidecar hands an entry out again whenever it
// cannot be sure it was handled (a Fail, a dropped call, a crash between the
// handler's side effect and the XACK, a peer reclaiming a slow delivery, a
// dead letter replayed to its source). Each of those copies carries the same
// branded id, so the branded id is the key to make a handler idempotent:
//
//   - a seen-set ([SkipSeen]) skips an id that was already processed;
//   - newer-wins ([NewerWins]) keeps, per business key (an order, an account),
//     the highest branded id applied and skips an older or equal one. Branded
//     ids order like the stream (6 bytes of milliseconds, then 8 of sequence,
//     as fixed-width lowercase hex), so a string comparison is the order: a
//     stale replay or a late redelivery never overwrites newer state.
//
// The in-memory stores are the default; for effects that must survive a
// restart, implement the store next to your data and, ideally, record the id in
// the same transaction as the effect, which makes the pair exactly-once.

// SeenStore remembers which branded ids were processed.
type SeenStore interface {
	// Seen reports whether id was recorded.
	Seen(ctx context.Context, id string) (bool, error)
	// Record records id as processed.
	Record(ctx context.Context, id string) error
}

// SkipSeen wraps next so that a delivery whose branded id store has seen is
// acknowledged without calling next, and the id of a delivery next handled
// successfully (returned nil, or acknowledged it, before any lost lease) is
// recorded. A store error
// fails the delivery, so it is retried rather than lost or handled twice.
//
// The id is recorded after next returns: a crash in between re-runs next on
// the redelivery (at-least-once). Two copies of one entry that run at the same
// moment can both pass the check; keep effects idempotent, or record the id in
// the effect's own transaction.
func SkipSeen(store SeenStore, next Handler) Handler {
	return func(ctx context.Context, d *Delivery) error {
		seen, err := store.Seen(ctx, d.ID)
		if err != nil {
			return fmt.Errorf("echomq: seen-set lookup of %s: %w", d.ID, err)
		}
		if seen {
			return nil
		}
		if err := next(ctx, d); err != nil {
			return err
		}
		if notDone(d) {
			return nil
		}
		return store.Record(ctx, d.ID)
	}
}

// notDone reports that d's handler did not finish it: it failed or
// dead-lettered it, or its lease was lost first (the handler may have given
// up on the cancelled ctx and returned nil; the entry comes back or runs on a
// peer, and must not then be skipped as seen).
func notDone(d *Delivery) bool {
	v := d.verdict()
	return v == failed || v == deadLettered || v == lost
}

// MemorySeen is the old name of [MemorySeenStore].
//
// Deprecated: use [MemorySeenStore] (and [NewMemorySeenStore]), the name
// every client gives it; MemorySeen goes away in the next release.
type MemorySeen = MemorySeenStore

// NewMemorySeen is the old name of [NewMemorySeenStore].
//
// Deprecated: use [NewMemorySeenStore]; NewMemorySeen goes away in the next
// release.
func NewMemorySeen(limit int) *MemorySeen { return NewMemorySeenStore(limit) }

// MemorySeenStore is an in-memory [SeenStore] that keeps the most recent ids up to
// a limit, forgetting the oldest first. Safe for concurrent use.
type MemorySeenStore struct {
	mu    sync.Mutex
	ids   map[string]struct{}
	order []string // ring of recorded ids when limited
	next  int
	limit int
}

// NewMemorySeenStore returns a seen-set holding at most limit ids (limit <= 0: no
// limit). Size it to cover the redelivery window: ids older than the last
// limit recorded ones are forgotten and would be handled again.
func NewMemorySeenStore(limit int) *MemorySeenStore {
	return &MemorySeenStore{ids: make(map[string]struct{}), limit: limit}
}

// Seen implements [SeenStore].
func (m *MemorySeenStore) Seen(_ context.Context, id string) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.ids[id]
	return ok, nil
}

// Record implements [SeenStore].
func (m *MemorySeenStore) Record(_ context.Context, id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.ids[id]; ok {
		return nil
	}
	m.ids[id] = struct{}{}
	if m.limit <= 0 {
		return nil
	}
	if len(m.order) < m.limit {
		m.order = append(m.order, id)
		return nil
	}
	delete(m.ids, m.order[m.next])
	m.order[m.next] = id
	m.next = (m.next + 1) % m.limit
	return nil
}

// VersionStore remembers, per business key, the highest branded id applied.
type VersionStore interface {
	// Latest returns the highest branded id recorded for key, or "" if none.
	Latest(ctx context.Context, key string) (string, error)
	// Advance records id for key unless an equal or newer id is recorded,
	// atomically, and reports whether it recorded.
	Advance(ctx context.Context, key, id string) (bool, error)
}

// NewerWins wraps next so that a delivery whose branded id is not newer than
// the one last applied for its business key (keyOf(d)) is acknowledged
// without calling next; after next succeeds, its id becomes the key's latest.
// A delivery whose keyOf is "" is passed to next unchecked. A store error
// fails the delivery.
//
// Deliveries of one key may run concurrently (Concurrency > 1): the check and
// the effect are not one step, so an older delivery that passed the check
// can still apply after a newer one. Route a key to one handler at a time, or
// make the effect itself conditional on the id (`UPDATE … WHERE version < $id`).
func NewerWins(store VersionStore, keyOf func(*Delivery) string, next Handler) Handler {
	return func(ctx context.Context, d *Delivery) error {
		key := keyOf(d)
		if key == "" {
			return next(ctx, d)
		}
		latest, err := store.Latest(ctx, key)
		if err != nil {
			return fmt.Errorf("echomq: latest id of key %q: %w", key, err)
		}
		if !IsNewer(d.ID, latest) {
			return nil
		}
		if err := next(ctx, d); err != nil {
			return err
		}
		if notDone(d) {
			return nil
		}
		_, err = store.Advance(ctx, key, d.ID)
		return err
	}
}

// MemoryVersions is the old name of [MemoryVersionStore].
//
// Deprecated: use [MemoryVersionStore] (and [NewMemoryVersionStore]), the
// name every client gives it; MemoryVersions goes away in the next release.
type MemoryVersions = MemoryVersionStore

// NewMemoryVersions is the old name of [NewMemoryVersionStore].
//
// Deprecated: use [NewMemoryVersionStore]; NewMemoryVersions goes away in the
// next release.
func NewMemoryVersions() *MemoryVersions { return NewMemoryVersionStore() }

// MemoryVersionStore is an in-memory [VersionStore]. Safe for concurrent use.
type MemoryVersionStore struct {
	mu     sync.Mutex
	latest map[string]string
}

// NewMemoryVersionStore returns an empty in-memory version store.
func NewMemoryVersionStore() *MemoryVersionStore {
	return &MemoryVersionStore{latest: make(map[string]string)}
}

// Latest implements [VersionStore].
func (m *MemoryVersionStore) Latest(_ context.Context, key string) (string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.latest[key], nil
}

// Advance implements [VersionStore].
func (m *MemoryVersionStore) Advance(_ context.Context, key, id string) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !IsNewer(id, m.latest[key]) {
		return false, nil
	}
	m.latest[key] = id
	return true, nil
}

// IsNewer reports whether branded id a orders after b; every id is newer than
// "". Both are 28 lowercase hex characters, so text order is byte order is
// stream order.
func IsNewer(a, b string) bool { return a > b }

// ParseBrandedID splits a branded id into its unix milliseconds and sequence:
// the stream id `<ms>-<seq>` the entry got where it was first appended.
func ParseBrandedID(id string) (ms, seq uint64, err error) {
	if len(id) != 28 {
		return 0, 0, fmt.Errorf("echomq: branded id %q: want 28 hex characters, got %d", id, len(id))
	}
	raw, err := hex.DecodeString(id)
	if err != nil || hex.EncodeToString(raw) != id {
		return 0, 0, fmt.Errorf("echomq: branded id %q: not lowercase hex", id)
	}
	for _, b := range raw[:6] {
		ms = ms<<8 | uint64(b)
	}
	for _, b := range raw[6:] {
		seq = seq<<8 | uint64(b)
	}
	return ms, seq, nil
}
