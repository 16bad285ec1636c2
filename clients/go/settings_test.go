package echomq_test

// Every subscription setting reaches the sidecar: one observable effect each,
// against the real sidecar (whose own defaults, from the conformance suite's
// sidecar_args, are a retry backoff of 100 ms up to 1 s).

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	echomq "github.com/echomq/echomq-sidecar/clients/go"
)

// handlerLog records handler calls: attempts and start times per id.
type handlerLog struct {
	mu      sync.Mutex
	calls   int
	starts  map[string][]time.Time
	running int
	most    int
}

func newHandlerLog() *handlerLog { return &handlerLog{starts: map[string][]time.Time{}} }

func (l *handlerLog) enter(id string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls++
	l.starts[id] = append(l.starts[id], time.Now())
	l.running++
	l.most = max(l.most, l.running)
	return len(l.starts[id])
}

func (l *handlerLog) leave() {
	l.mu.Lock()
	l.running--
	l.mu.Unlock()
}

func (l *handlerLog) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.calls
}

// gap is the time between call i and call i+1 (from 0) for id.
func (l *handlerLog) gap(t *testing.T, id string, i int) time.Duration {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.starts[id]
	if len(s) < i+2 {
		t.Fatalf("%s handled %d times, want %d", id, len(s), i+2)
	}
	return s[i+1].Sub(s[i])
}

// runConsumer runs cfg (Conn, Group "g" and StartBeginning filled in) with h
// and returns a graceful stop; the test's end cancels it in any case.
func runConsumer(t *testing.T, cfg echomq.ConsumerConfig, h echomq.Handler, bh echomq.BatchHandler) func() {
	t.Helper()
	cfg.Group, cfg.Start = "g", echomq.StartBeginning()
	consumer := echomq.NewConsumer(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		var err error
		if bh != nil {
			err = consumer.RunBatch(ctx, bh)
		} else {
			err = consumer.Run(ctx, h)
		}
		if err != nil && ctx.Err() == nil {
			t.Errorf("Run returned early: %v", err)
		}
		done <- err
	}()
	var once sync.Once
	stop := func() { once.Do(func() { stopRun(t, consumer, done) }) }
	t.Cleanup(func() {
		cancel()
		once.Do(func() { <-done })
	})
	return stop
}

func TestMaxInFlightBoundsWhatTheCallHolds(t *testing.T) {
	cl, conn := dialFixture(t)
	stream := uniqueStream("go:max-in-flight")
	appendN(t, conn, stream, 10)
	log, release := newHandlerLog(), make(chan struct{})
	stop := runConsumer(t, echomq.ConsumerConfig{Conn: conn, Stream: stream, FlowControl: echomq.FlowControl{MaxInFlight: 3, Concurrency: 10}},
		func(ctx context.Context, d *echomq.Delivery) error {
			log.enter(d.ID)
			defer log.leave()
			<-release
			return nil
		}, nil)
	if err := waitFor(10*time.Second, func() bool { return log.count() >= 3 }); err != nil {
		t.Fatalf("%d handlers started, want 3", log.count())
	}
	time.Sleep(300 * time.Millisecond) // room for a fourth delivery, were the bound not sent
	if n, p := log.count(), pendingCount(cl.redisAddr, stream); n != 3 || p != 3 {
		t.Fatalf("%d handlers started, XPENDING %d; MaxInFlight 3 must bound both", n, p)
	}
	close(release)
	if err := waitFor(10*time.Second, func() bool { return log.count() == 10 && pendingCount(cl.redisAddr, stream) == 0 }); err != nil {
		t.Fatalf("%d of 10 handled", log.count())
	}
	stop()
}

func TestBatchHandlerRunsOneBatchAtATimeByDefault(t *testing.T) {
	cl, conn := dialFixture(t)
	stream := uniqueStream("go:batch-concurrency")
	appendN(t, conn, stream, 12)
	log := newHandlerLog()
	stop := runConsumer(t, echomq.ConsumerConfig{Conn: conn, Stream: stream, MaxInFlight: 8, MaxBatch: 1}, nil,
		func(ctx context.Context, batch []*echomq.Delivery) []error {
			log.enter(batch[0].ID)
			defer log.leave()
			time.Sleep(20 * time.Millisecond)
			return nil
		})
	if err := waitFor(20*time.Second, func() bool { return log.count() == 12 && pendingCount(cl.redisAddr, stream) == 0 }); err != nil {
		t.Fatalf("%d of 12 batches handled", log.count())
	}
	stop()
	if log.most != 1 {
		t.Fatalf("%d batch handlers ran at once; the default for a batch handler is 1", log.most)
	}
}

func TestMaxDeliveriesDeadLettersAPoisonEntry(t *testing.T) {
	cl, conn := dialFixture(t)
	stream := uniqueStream("go:max-deliveries")
	appended := appendN(t, conn, stream, 1)
	log := newHandlerLog()
	stop := runConsumer(t, echomq.ConsumerConfig{Conn: conn, Stream: stream, MaxDeliveries: 2},
		func(ctx context.Context, d *echomq.Delivery) error {
			log.enter(d.ID)
			defer log.leave()
			return errors.New("always fails")
		}, nil)
	if err := waitFor(20*time.Second, func() bool { return redisLen(cl.redisAddr, stream+":dlq") == 1 }); err != nil {
		t.Fatalf("no dead letter after %d calls: MaxDeliveries did not reach the sidecar", log.count())
	}
	time.Sleep(300 * time.Millisecond) // a third delivery would come after the 100 ms backoff
	stop()
	if n := log.count(); n != 2 {
		t.Fatalf("handled %d times, want 2 (MaxDeliveries)", n)
	}
	page, err := echomq.NewAdmin(conn).ListDeadLetters(withTimeout(t, 10*time.Second), stream, echomq.DeadLetterRange{})
	if err != nil || len(page.DeadLetters) != 1 {
		t.Fatalf("dead letters: %+v %v", page, err)
	}
	if dl := page.DeadLetters[0]; dl.Entry.ID != appended[0].ID || dl.Attempts != 2 || dl.Reason != "always fails" {
		t.Fatalf("dead letter %+v, want %s after 2 attempts with the last reason", dl, appended[0].ID)
	}
	if n := pendingCount(cl.redisAddr, stream); n != 0 {
		t.Fatalf("XPENDING %d, want 0 after the poison entry moved", n)
	}
}

func TestDeadLetterStreamNamesWhereDeadLettersGo(t *testing.T) {
	cl, conn := dialFixture(t)
	stream := uniqueStream("go:dead-letter-stream")
	dlq := stream + ":graveyard"
	appended := appendN(t, conn, stream, 1)
	stop := runConsumer(t, echomq.ConsumerConfig{Conn: conn, Stream: stream, DeadLetterStream: dlq},
		func(ctx context.Context, d *echomq.Delivery) error { return d.DeadLetter("unparseable") }, nil)
	if err := waitFor(10*time.Second, func() bool { return redisLen(cl.redisAddr, dlq) == 1 }); err != nil {
		t.Fatalf("nothing in %s: DeadLetterStream did not reach the sidecar", dlq)
	}
	stop()
	if n := redisLen(cl.redisAddr, stream+":dlq"); n != 0 {
		t.Fatalf("the default dead-letter stream has %d entries, want 0", n)
	}
	page, err := echomq.NewAdmin(conn).ListDeadLetters(withTimeout(t, 10*time.Second), "", echomq.DeadLetterRange{DeadLetterStream: dlq})
	if err != nil || len(page.DeadLetters) != 1 || page.DeadLetters[0].Entry.ID != appended[0].ID {
		t.Fatalf("dead letters of %s: %+v %v", dlq, page, err)
	}
}

func TestNoAckNeverLeavesAnEntryPending(t *testing.T) {
	cl, conn := dialFixture(t)
	stream := uniqueStream("go:no-ack")
	appendN(t, conn, stream, 1)
	log, release := newHandlerLog(), make(chan struct{})
	stop := runConsumer(t, echomq.ConsumerConfig{Conn: conn, Stream: stream, NoAck: true},
		func(ctx context.Context, d *echomq.Delivery) error {
			log.enter(d.ID)
			defer log.leave()
			<-release
			return errors.New("fails, and is lost: at-most-once")
		}, nil)
	if err := waitFor(10*time.Second, func() bool { return log.count() == 1 }); err != nil {
		t.Fatal("not delivered")
	}
	if n := pendingCount(cl.redisAddr, stream); n != 0 {
		t.Fatalf("XPENDING %d while the handler runs, want 0: NoAck did not reach the sidecar", n)
	}
	close(release)
	time.Sleep(500 * time.Millisecond) // a retry would come after the 100 ms backoff
	stop()
	if n := log.count(); n != 1 {
		t.Fatalf("handled %d times, want once: a NoAck entry is never redelivered", n)
	}
}

// failTimes fails each entry's first n deliveries and acks the next.
func failTimes(log *handlerLog, n int) echomq.Handler {
	return func(ctx context.Context, d *echomq.Delivery) error {
		call := log.enter(d.ID)
		defer log.leave()
		if call <= n {
			return errors.New("fails for now")
		}
		return nil
	}
}

func TestRetryBackoffInitialReachesTheSidecar(t *testing.T) {
	cl, conn := dialFixture(t)
	stream := uniqueStream("go:backoff-initial")
	appended := appendN(t, conn, stream, 1)
	log := newHandlerLog()
	// 1.2 s, jittered into its upper half: at least 600 ms (the sidecar's own
	// default here is 100 ms).
	stop := runConsumer(t, echomq.ConsumerConfig{Conn: conn, Stream: stream,
		RetryBackoffInitial: 1200 * time.Millisecond, RetryBackoffMax: 1200 * time.Millisecond}, failTimes(log, 1), nil)
	if err := waitFor(10*time.Second, func() bool { return log.count() == 2 && pendingCount(cl.redisAddr, stream) == 0 }); err != nil {
		t.Fatalf("%d calls", log.count())
	}
	stop()
	if gap := log.gap(t, appended[0].ID, 0); gap < 590*time.Millisecond {
		t.Fatalf("redelivered after %v, want at least 600 ms (RetryBackoffInitial 1.2 s)", gap)
	}
}

func TestRetryBackoffMaxCapsTheDelay(t *testing.T) {
	cl, conn := dialFixture(t)
	stream := uniqueStream("go:backoff-max")
	appended := appendN(t, conn, stream, 1)
	log := newHandlerLog()
	// 300 ms doubling per attempt, capped at 300 ms: the third retry waits
	// 150 to 300 ms. Without the cap the sidecar's own (1 s) would make it
	// 1.2 s capped at 1 s, jittered: at least 500 ms.
	stop := runConsumer(t, echomq.ConsumerConfig{Conn: conn, Stream: stream,
		RetryBackoffInitial: 300 * time.Millisecond, RetryBackoffMax: 300 * time.Millisecond}, failTimes(log, 3), nil)
	if err := waitFor(10*time.Second, func() bool { return log.count() == 4 && pendingCount(cl.redisAddr, stream) == 0 }); err != nil {
		t.Fatalf("%d calls", log.count())
	}
	stop()
	if gap := log.gap(t, appended[0].ID, 2); gap >= 480*time.Millisecond {
		t.Fatalf("third retry after %v, want at most 300 ms (RetryBackoffMax)", gap)
	}
}

func TestAckDeadlineReturnsAnUnsettledDelivery(t *testing.T) {
	cl, conn := dialFixture(t)
	stream := uniqueStream("go:ack-deadline")
	appended := appendN(t, conn, stream, 1)
	log, release := newHandlerLog(), make(chan struct{})
	stop := runConsumer(t, echomq.ConsumerConfig{Conn: conn, Stream: stream, AckDeadline: 300 * time.Millisecond, Concurrency: 2},
		func(ctx context.Context, d *echomq.Delivery) error {
			n := log.enter(d.ID)
			defer log.leave()
			if n == 1 {
				<-release // never settles in time
			}
			return nil
		}, nil)
	if err := waitFor(10*time.Second, func() bool { return log.count() == 2 && pendingCount(cl.redisAddr, stream) == 0 }); err != nil {
		t.Fatalf("%d calls, XPENDING %d: the held delivery did not come back after AckDeadline", log.count(), pendingCount(cl.redisAddr, stream))
	}
	close(release)
	stop()
	if gap := log.gap(t, appended[0].ID, 0); gap < 300*time.Millisecond {
		t.Fatalf("redelivered after %v, before the 300 ms ack deadline", gap)
	}
}
