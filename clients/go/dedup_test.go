package echomq_test

// Dedup keys (AppendOptions.DedupKey, BatchEntry.DedupKey, AppendResult.Duplicate) against
// the real sidecar.

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	echomq "github.com/echomq/echomq-sidecar/clients/go"
)

func dedupProducer(t *testing.T) (*echomq.Streams, *cluster) {
	t.Helper()
	cl := fixture(t)
	conn, err := echomq.Dial(cl.listen)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return echomq.NewStreams(conn), cl
}

func TestDedupKeyMakesARetriedAppendAnswerTheFirstOne(t *testing.T) {
	producer, cl := dedupProducer(t)
	stream := uniqueStream("go:dedup")
	ctx := withTimeout(t, 10*time.Second)
	first, err := producer.Append(ctx, stream, map[string][]byte{"n": []byte("1")}, echomq.AppendOptions{DedupKey: "order-1"})
	if err != nil {
		t.Fatal(err)
	}
	retried, err := producer.Append(ctx, stream, map[string][]byte{"n": []byte("1, again")}, echomq.AppendOptions{DedupKey: "order-1"})
	if err != nil {
		t.Fatal(err)
	}
	if first.Duplicate || !retried.Duplicate {
		t.Fatalf("duplicate flags: first %v, retry %v; want false, true", first.Duplicate, retried.Duplicate)
	}
	if retried.ID != first.ID || retried.StreamID != first.StreamID || retried.Stream != first.Stream {
		t.Fatalf("the retry answered %+v, the first append %+v", retried, first)
	}
	seen := map[string]bool{first.ID: true}
	for _, opts := range [][]echomq.AppendOption{nil, {echomq.AppendOptions{DedupKey: ""}}, nil} {
		plain, err := producer.Append(ctx, stream, map[string][]byte{"n": []byte("2")}, opts...)
		if err != nil {
			t.Fatal(err)
		}
		if plain.Duplicate || seen[plain.ID] {
			t.Fatalf("an append without a dedup key was deduplicated: %+v", plain)
		}
		seen[plain.ID] = true
	}
	if n := redisInt(t, cl.redisAddr, "XLEN", stream); n != 4 {
		t.Fatalf("XLEN %s = %d, want 4 (one for the key, three without)", stream, n)
	}
}

func TestBatchEntriesCarryTheirOwnDedupKeys(t *testing.T) {
	producer, cl := dedupProducer(t)
	stream := uniqueStream("go:dedup-batch")
	ctx := withTimeout(t, 10*time.Second)
	single, err := producer.Append(ctx, stream, map[string][]byte{"n": []byte("0")}, echomq.AppendOptions{DedupKey: "k0"})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := producer.AppendBatchEntries(ctx, stream, []echomq.BatchEntry{
		{Fields: map[string][]byte{"n": []byte("1")}, DedupKey: "k1"},
		{Fields: map[string][]byte{"n": []byte("1")}, DedupKey: "k1"},
		{Fields: map[string][]byte{"n": []byte("0")}, DedupKey: "k0"},
		{Fields: map[string][]byte{"n": []byte("2")}},
		{Fields: map[string][]byte{"n": []byte("3")}},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []bool{false, true, true, false, false}
	for i, a := range batch {
		if a.Duplicate != want[i] {
			t.Fatalf("entry %d: Duplicate %v, want %v (%+v)", i, a.Duplicate, want[i], batch)
		}
	}
	if batch[1].ID != batch[0].ID || batch[1].StreamID != batch[0].StreamID || batch[2].ID != single.ID {
		t.Fatalf("duplicates must answer the first ids: %+v (single %+v)", batch, single)
	}
	again, err := producer.AppendBatchEntries(ctx, stream, []echomq.BatchEntry{{Fields: map[string][]byte{"n": []byte("1")}, DedupKey: "k1"}})
	if err != nil {
		t.Fatal(err)
	}
	if !again[0].Duplicate || again[0].ID != batch[0].ID {
		t.Fatalf("a batch retried: %+v, want a duplicate of %+v", again[0], batch[0])
	}
	if n := redisInt(t, cl.redisAddr, "XLEN", stream); n != 4 {
		t.Fatalf("XLEN %s = %d, want 4", stream, n)
	}
}

func TestDedupKeyOverMaxNameBytesIsRefusedAndWritesNothing(t *testing.T) {
	producer, cl := dedupProducer(t)
	stream := uniqueStream("go:dedup-long")
	ctx := withTimeout(t, 10*time.Second)
	long := strings.Repeat("k", 1025)
	_, err := producer.Append(ctx, stream, map[string][]byte{"n": []byte("1")}, echomq.AppendOptions{DedupKey: long})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("a 1025-byte dedup key: %v, want INVALID_ARGUMENT", err)
	}
	_, err = producer.AppendBatchEntries(ctx, stream, []echomq.BatchEntry{{Fields: map[string][]byte{"n": []byte("1")}, DedupKey: long}})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("a batch entry's 1025-byte dedup key: %v, want INVALID_ARGUMENT", err)
	}
	if n := redisInt(t, cl.redisAddr, "XLEN", stream); n != 0 {
		t.Fatalf("XLEN %s = %d after refused appends, want 0", stream, n)
	}
	fits, err := producer.Append(ctx, stream, map[string][]byte{"n": []byte("1")}, echomq.AppendOptions{DedupKey: long[:1024]})
	if err != nil || fits.Duplicate {
		t.Fatalf("a 1024-byte dedup key: %+v, %v", fits, err)
	}
}

func TestADedupKeyForAWholeBatchIsRefusedBeforeAnyCall(t *testing.T) {
	producer, cl := dedupProducer(t)
	stream := uniqueStream("go:dedup-batch-option")
	ctx := withTimeout(t, 10*time.Second)
	_, err := producer.AppendBatch(ctx, stream, []map[string][]byte{{"n": []byte("1")}}, echomq.AppendOptions{DedupKey: "k"})
	if err == nil || !strings.Contains(err.Error(), "BatchEntry.DedupKey") {
		t.Fatalf("AppendBatch with AppendOptions.DedupKey: %v, want a refusal naming BatchEntry.DedupKey", err)
	}
	_, err = producer.AppendBatchEntries(ctx, stream, []echomq.BatchEntry{{Fields: map[string][]byte{"n": []byte("1")}}}, echomq.AppendOptions{DedupKey: "k"})
	if err == nil {
		t.Fatal("AppendBatchEntries with AppendOptions.DedupKey was not refused")
	}
	if n := redisInt(t, cl.redisAddr, "XLEN", stream); n != 0 {
		t.Fatalf("XLEN %s = %d, want 0", stream, n)
	}
}
