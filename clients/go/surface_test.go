package echomq_test

// The client surface of clients/CONTRACT.md ("Surface"): one Streams type
// that appends, reads and trims, options as structs, and the deprecated old
// names (Producer, NewProducer, WithMaxLen, WithPartitionKey, WithDedupKey,
// Appended, Trimmed, Replay, MemorySeen, MemoryVersions)
// still working for a release.

import (
	"strings"
	"testing"
	"time"

	echomq "github.com/echomq/echomq-sidecar/clients/go"
)

func TestOneStreamsTypeAppendsReadsAndTrims(t *testing.T) {
	streams, cl := dedupProducer(t)
	stream := uniqueStream("go:surface")
	ctx := withTimeout(t, 10*time.Second)
	one, err := streams.Append(ctx, stream, map[string][]byte{"n": []byte("0")}, echomq.AppendOptions{DedupKey: "k0"})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := streams.AppendBatch(ctx, stream, []map[string][]byte{{"n": []byte("1")}, {"n": []byte("2")}}, echomq.AppendOptions{MaxLen: 100})
	if err != nil {
		t.Fatal(err)
	}
	page, err := streams.Read(ctx, stream, echomq.ReadRange{})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Entries) != 3 || page.Entries[0].ID != one.ID || page.Entries[2].ID != batch[1].ID {
		t.Fatalf("read %+v after appending %v and %v", page.Entries, one, batch)
	}
	trimmed, err := streams.Trim(ctx, stream, echomq.TrimBound{MaxLen: 1, IgnoreGroups: true})
	if err != nil {
		t.Fatal(err)
	}
	if trimmed.Count != 2 || redisInt(t, cl.redisAddr, "XLEN", stream) != 1 {
		t.Fatalf("trim: %+v", trimmed)
	}
}

func TestTheDeprecatedProducerNamesStillWork(t *testing.T) {
	cl := fixture(t)
	conn, err := echomq.Dial(cl.listen)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	var producer *echomq.Producer = echomq.NewProducer(conn) // an alias of *Streams
	var _ *echomq.Streams = producer
	var _ echomq.Appended = echomq.AppendResult{}
	var _ echomq.Trimmed = echomq.TrimResult{}
	var _ echomq.Replay = echomq.ReplayResult{}
	var _ *echomq.MemorySeenStore = echomq.NewMemorySeen(1)
	var _ *echomq.MemoryVersionStore = echomq.NewMemoryVersions()
	stream := uniqueStream("go:surface-deprecated")
	ctx := withTimeout(t, 10*time.Second)
	first, err := producer.Append(ctx, stream, map[string][]byte{"n": []byte("1")}, echomq.WithDedupKey("k"), echomq.WithMaxLen(100), echomq.WithPartitionKey(""))
	if err != nil {
		t.Fatal(err)
	}
	again, err := producer.Append(ctx, stream, map[string][]byte{"n": []byte("1")}, echomq.WithDedupKey("k"))
	if err != nil || !again.Duplicate || again.ID != first.ID {
		t.Fatalf("WithDedupKey retry: %+v, %v; want the first append %+v as a duplicate", again, err, first)
	}
	_, err = producer.AppendBatch(ctx, stream, []map[string][]byte{{"n": []byte("2")}}, echomq.WithDedupKey("k"))
	if err == nil || !strings.Contains(err.Error(), "BatchEntry.DedupKey") {
		t.Fatalf("WithDedupKey on a batch: %v, want a refusal naming BatchEntry.DedupKey", err)
	}
	if n := redisInt(t, cl.redisAddr, "XLEN", stream); n != 1 {
		t.Fatalf("XLEN %d, want 1", n)
	}
}
