package echomq_test

// Behaviours beyond the shared conformance suite, against the same fixture.

import (
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	echomq "github.com/echomq/echomq-sidecar/clients/go"
)

// uniqueStream names a fresh stream, so repeated runs (-count=N) start clean.
func uniqueStream(prefix string) string {
	return prefix + ":" + strconv.FormatInt(time.Now().UnixNano(), 36)
}

func TestRefusedSubscriptionIsReturnedAndNotRetried(t *testing.T) {
	cl := fixture(t)
	consumer := echomq.NewConsumer(echomq.ConsumerConfig{
		Target:      cl.listen,
		Stream:      "go:refused",
		Group:       "g",
		Start:       echomq.StartBeginning(),
		MaxInFlight: 1_000_000, // above the sidecar's --max-in-flight-limit
	})
	begin := time.Now()
	err := consumer.Run(withTimeout(t, 20*time.Second), func(context.Context, *echomq.Delivery) error { return nil })
	var refused *echomq.SubscriptionError
	if !errors.As(err, &refused) || refused.Code() != codes.InvalidArgument || status.Code(err) != codes.InvalidArgument {
		t.Fatalf("Run returned %v, want a SubscriptionError with INVALID_ARGUMENT", err)
	}
	if took := time.Since(begin); took > 2*time.Second {
		t.Fatalf("Run took %v: a permanent error must not be retried", took)
	}
}

func TestProducerRefusalCarriesTheStatus(t *testing.T) {
	cl := fixture(t)
	conn, err := echomq.Dial(cl.listen)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, err = echomq.NewStreams(conn).Append(withTimeout(t, 10*time.Second), "go:reserved", map[string][]byte{"id": []byte("x")})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("appending the reserved field: %v, want INVALID_ARGUMENT", err)
	}
}

func TestStopPastItsDeadlineLeavesTheEntryPending(t *testing.T) {
	cl := fixture(t)
	stream := uniqueStream("go:stop-deadline")
	conn, err := echomq.Dial(cl.listen)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := echomq.NewStreams(conn).Append(withTimeout(t, 10*time.Second), stream, map[string][]byte{"n": []byte("1")}); err != nil {
		t.Fatal(err)
	}
	consumer := echomq.NewConsumer(echomq.ConsumerConfig{Conn: conn, Stream: stream, Group: "g", Start: echomq.StartBeginning()})
	started := make(chan struct{})
	handlerEnd := make(chan error, 1)
	done := make(chan error, 1)
	go func() {
		done <- consumer.Run(context.Background(), func(ctx context.Context, d *echomq.Delivery) error {
			close(started)
			<-ctx.Done() // slower than the deadline; honours cancellation
			handlerEnd <- ctx.Err()
			return ctx.Err()
		})
	}()
	<-started
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	begin := time.Now()
	err = consumer.Stop(ctx)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Stop: %v, want DeadlineExceeded", err)
	}
	if took := time.Since(begin); took > 2*time.Second {
		t.Fatalf("Stop took %v past a 200 ms deadline", took)
	}
	if err := <-done; err != nil {
		t.Fatalf("Run after Stop: %v", err)
	}
	if err := <-handlerEnd; !errors.Is(err, context.Canceled) {
		t.Fatalf("the handler's context ended with %v, want Canceled", err)
	}
	if n := redisInt(t, cl.redisAddr, "XPENDING", stream, "g"); n != 1 {
		t.Fatalf("XPENDING %d, want 1: an unfinished delivery stays pending", n)
	}
}

func TestUnixSocketTarget(t *testing.T) {
	fixture(t) // the suite's sidecar_args and a check that the binary exists
	socket := filepath.Join(t.TempDir(), "echomq.sock")
	cl, err := startCluster("unix:"+socket, nil)
	t.Cleanup(func() {
		if cl != nil {
			cl.close()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := echomq.Dial("unix:" + socket)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	stream := uniqueStream("go:unix")
	appended, err := echomq.NewStreams(conn).AppendBatch(withTimeout(t, 10*time.Second), stream,
		[]map[string][]byte{{"n": []byte("1")}, {"n": []byte("2")}}, echomq.AppendOptions{MaxLen: 100})
	if err != nil || len(appended) != 2 || !echomq.IsNewer(appended[1].ID, appended[0].ID) {
		t.Fatalf("AppendBatch: %v %v", appended, err)
	}
	consumer := echomq.NewConsumer(echomq.ConsumerConfig{Target: "unix:" + socket, Stream: stream, Group: "g", Start: echomq.StartBeginning(), Concurrency: 1})
	got := make(chan string, 2)
	done := make(chan error, 1)
	go func() {
		done <- consumer.Run(context.Background(), func(_ context.Context, d *echomq.Delivery) error {
			got <- d.ID + "/" + string(d.Payload["n"]) + "/" + strconv.Itoa(int(d.Attempts))
			return nil
		})
	}()
	for i, a := range appended {
		select {
		case s := <-got:
			if want := a.ID + "/" + strconv.Itoa(i+1) + "/1"; s != want {
				t.Errorf("delivery %d: %s, want %s", i, s, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("no delivery over the unix socket")
		}
	}
	if err := consumer.Stop(withTimeout(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// The sidecar applies acks in its next XACK batch, which may come a few
	// milliseconds after the call ended.
	if err := waitFor(5*time.Second, func() bool { return redisInt(t, cl.redisAddr, "XPENDING", stream, "g") == 0 }); err != nil {
		t.Fatalf("XPENDING %d after acks, want 0", redisInt(t, cl.redisAddr, "XPENDING", stream, "g"))
	}
}

func TestVerdictOfABrokenCallIsNeverSentOnTheNextCall(t *testing.T) {
	fixture(t)
	var file scenarioFile
	if err := readJSON(filepath.Join(repoRoot(), "tests", "conformance", "scenarios.json"), &file); err != nil {
		t.Fatal(err)
	}
	cl, err := startCluster("127.0.0.1:"+strconv.Itoa(freePort()), file.SidecarArgs)
	t.Cleanup(func() {
		if cl != nil {
			cl.close()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	counter := &wire{}
	conn, err := echomq.Dial(cl.listen, grpc.WithStreamInterceptor(counter.intercept))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	stream := uniqueStream("go:old-call")
	appended, err := echomq.NewStreams(conn).Append(withTimeout(t, 10*time.Second), stream, map[string][]byte{"n": []byte("1")})
	if err != nil {
		t.Fatal(err)
	}

	started, release := make(chan struct{}), make(chan struct{})
	firstCause := make(chan error, 1)
	var attempts []uint32
	var mu sync.Mutex
	consumer := echomq.NewConsumer(echomq.ConsumerConfig{Conn: conn, Stream: stream, Group: "g", Start: echomq.StartBeginning(), Concurrency: 1})
	done := make(chan error, 1)
	go func() {
		done <- consumer.Run(context.Background(), func(ctx context.Context, d *echomq.Delivery) error {
			mu.Lock()
			attempts = append(attempts, d.Attempts)
			first := len(attempts) == 1
			mu.Unlock()
			if first {
				close(started)
				<-release // ignores ctx: returns, and "acks", after the call broke
				firstCause <- context.Cause(ctx)
			}
			return nil
		})
	}()
	<-started
	cl.killSidecar()
	if err := cl.startSidecar(); err != nil {
		t.Fatal(err)
	}
	if err := waitFor(20*time.Second, func() bool { return counter.subscribed() >= 2 }); err != nil {
		t.Fatal("the consumer did not re-subscribe after the sidecar restart")
	}
	close(release)
	if err := waitFor(20*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return len(attempts) >= 2 }); err != nil {
		t.Fatal("the entry was not delivered again on the new call")
	}
	if err := consumer.Stop(withTimeout(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := counter.acked()[appended.ID]; n != 1 {
		t.Fatalf("%s acked %d times; the old call's verdict must be dropped, the new call's sent once", appended.ID, n)
	}
	if cause := <-firstCause; !errors.Is(cause, echomq.ErrCallEnded) {
		t.Fatalf("the broken call's handler context ended with cause %v, want ErrCallEnded", cause)
	}
	if len(attempts) != 2 || attempts[1] < 2 {
		t.Fatalf("attempts %v, want the redelivery to count a second attempt", attempts)
	}
	if err := waitFor(5*time.Second, func() bool { return redisInt(t, cl.redisAddr, "XPENDING", stream, "g") == 0 }); err != nil {
		t.Fatal("the entry is still pending")
	}
}

// A sharded stream (--sharded-streams <s>=3): each partition key's entries
// land on one shard and, consumed through the logical stream with one handler
// at a time, arrive in append order.
func TestPartitionKeyKeepsItsEntriesOnOneShardInOrder(t *testing.T) {
	fixture(t)
	var file scenarioFile
	if err := readJSON(filepath.Join(repoRoot(), "tests", "conformance", "scenarios.json"), &file); err != nil {
		t.Fatal(err)
	}
	stream := uniqueStream("go:sharded")
	args := append(append([]string{}, file.SidecarArgs...), "--sharded-streams", stream+"=3")
	cl, err := startCluster("127.0.0.1:"+strconv.Itoa(freePort()), args)
	t.Cleanup(func() {
		if cl != nil {
			cl.close()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := echomq.Dial(cl.listen)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	shards := map[string]bool{}
	for k := range 3 {
		shards[stream+":{"+stream+":"+strconv.Itoa(k)+"}"] = true
	}

	producer := echomq.NewStreams(conn)
	keys := []string{"a", "b"}
	byKey := map[string][]echomq.AppendResult{}
	for i := range 4 {
		for _, key := range keys {
			a, err := producer.Append(withTimeout(t, 10*time.Second), stream,
				map[string][]byte{"key": []byte(key), "n": []byte(strconv.Itoa(i))}, echomq.AppendOptions{PartitionKey: key})
			if err != nil {
				t.Fatal(err)
			}
			byKey[key] = append(byKey[key], a)
		}
	}
	for _, key := range keys {
		batch, err := producer.AppendBatch(withTimeout(t, 10*time.Second), stream, []map[string][]byte{
			{"key": []byte(key), "n": []byte("4")}, {"key": []byte(key), "n": []byte("5")},
		}, echomq.AppendOptions{PartitionKey: key})
		if err != nil {
			t.Fatal(err)
		}
		byKey[key] = append(byKey[key], batch...)
	}
	for key, entries := range byKey {
		for _, a := range entries {
			if a.Stream != entries[0].Stream || !shards[a.Stream] {
				t.Fatalf("key %q: entries written to %v, want one shard of %v", key, entries, shards)
			}
		}
	}

	var mu sync.Mutex
	var got []*echomq.Delivery
	consumer := echomq.NewConsumer(echomq.ConsumerConfig{
		Conn: conn, Stream: stream, Group: "g", Start: echomq.StartBeginning(),
		Concurrency: 1, // one handler at a time, in arrival order: got is the hand-out order
	})
	done := make(chan error, 1)
	go func() {
		done <- consumer.Run(context.Background(), func(_ context.Context, d *echomq.Delivery) error {
			mu.Lock()
			got = append(got, d)
			mu.Unlock()
			return nil
		})
	}()
	if err := waitFor(20*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return len(got) >= 12 }); err != nil {
		t.Fatalf("%d of 12 deliveries", len(got))
	}
	allAcked := func() bool {
		for shard := range shards {
			if redisInt(t, cl.redisAddr, "XPENDING", shard, "g") != 0 {
				return false
			}
		}
		return true
	}
	if err := waitFor(5*time.Second, allAcked); err != nil {
		t.Fatal("entries still pending after their handlers returned")
	}
	if err := consumer.Stop(withTimeout(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 12 {
		t.Fatalf("%d deliveries, want 12", len(got))
	}
	for key, entries := range byKey {
		var delivered []*echomq.Delivery
		for _, d := range got {
			if string(d.Payload["key"]) == key {
				delivered = append(delivered, d)
			}
		}
		if len(delivered) != len(entries) {
			t.Fatalf("key %q: %d deliveries, want %d", key, len(delivered), len(entries))
		}
		for i, d := range delivered {
			if d.ID != entries[i].ID || d.Stream != entries[i].Stream || d.Attempts != 1 {
				t.Fatalf("key %q delivery %d: %s in %s (attempt %d), want %s in %s: not in append order",
					key, i, d.ID, d.Stream, d.Attempts, entries[i].ID, entries[i].Stream)
			}
		}
	}
}

// The module as its users get it: a fresh module outside the repository
// requires it (through a replace, as it is not published), builds and runs a
// program that appends and reads back through the fixture's sidecar.
func TestFreshModuleOutsideTheRepository(t *testing.T) {
	cl := fixture(t)
	if testing.Short() {
		t.Skip("builds a program: not in -short")
	}
	out, err := exec.Command("./check-fresh-module", cl.listen).CombinedOutput()
	t.Logf("%s", out)
	if err != nil {
		t.Fatalf("check-fresh-module: %v", err)
	}
	if !strings.Contains(string(out), "fresh module: appended") {
		t.Fatal("the fresh module's program did not report its round trip")
	}
}
