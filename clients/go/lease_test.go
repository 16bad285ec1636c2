package echomq_test

// LEASE_LOST beyond the conformance scenario: the batch handler's form, and
// explicit verdicts after the signal.

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc"

	echomq "github.com/echomq/echomq-sidecar/clients/go"
)

// steal makes a peer named thief take the entry (XCLAIM … 0), as a peer's
// reclaim would.
func steal(t *testing.T, cl *cluster, stream, streamID string) {
	t.Helper()
	reply, err := redisDo(cl.redisAddr, "XCLAIM", stream, "g", "thief", "0", streamID)
	if got, _ := reply.([]any); err != nil || len(got) != 1 {
		t.Errorf("XCLAIM %s: %v %v", streamID, reply, err)
	}
}

func TestLeaseLostInABatchMarksThatDeliveryAndSendsNoVerdictForIt(t *testing.T) {
	cl := fixture(t)
	stream := uniqueStream("go:lease-batch")
	w := &wire{}
	conn, err := echomq.Dial(cl.listen, grpc.WithStreamInterceptor(w.intercept))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	appended := appendN(t, conn, stream, 2)
	lost := make(chan string, 4)
	type seen struct {
		stolenLost, keptLost bool
		ctxErr, ackErr       error
	}
	first := make(chan seen, 1)
	calls := 0
	stop := runConsumer(t, echomq.ConsumerConfig{Conn: conn, Stream: stream, MaxBatch: 2,
		OnVerdictError: func(e echomq.VerdictError) {
			if e.Code == echomq.CodeLeaseLost {
				lost <- e.ID
			}
		}}, nil,
		func(ctx context.Context, batch []*echomq.Delivery) []error {
			calls++
			if calls > 1 {
				return nil
			}
			if len(batch) != 2 {
				t.Errorf("first batch of %d, want both entries", len(batch))
				return nil
			}
			stolen, kept := batch[0], batch[1]
			steal(t, cl, stream, stolen.StreamID)
			select {
			case id := <-lost:
				if id != stolen.ID {
					t.Errorf("LEASE_LOST for %s, want %s", id, stolen.ID)
				}
			case <-time.After(20 * time.Second):
				t.Error("no LEASE_LOST within 20 s")
			}
			first <- seen{stolenLost: stolen.LeaseLost(), keptLost: kept.LeaseLost(), ctxErr: ctx.Err(), ackErr: stolen.Ack()}
			return nil // acks kept; nothing is sent for stolen
		})
	var got seen
	select {
	case got = <-first:
	case <-time.After(30 * time.Second):
		t.Fatal("the first batch did not finish")
	}
	if !got.stolenLost || got.keptLost || got.ctxErr != nil || !errors.Is(got.ackErr, echomq.ErrLeaseLost) {
		t.Fatalf("after LEASE_LOST: stolen.LeaseLost %v, kept.LeaseLost %v, ctx %v, stolen.Ack() %v; want true, false, nil, ErrLeaseLost",
			got.stolenLost, got.keptLost, got.ctxErr, got.ackErr)
	}
	// The reclaim beat (2 s idle) takes the entry back from the idle thief and
	// delivers it again; that delivery is acked.
	if err := waitFor(20*time.Second, func() bool {
		return w.acked()[appended[0].ID] == 1 && pendingCount(cl.redisAddr, stream) == 0
	}); err != nil {
		t.Fatalf("the stolen entry was not redelivered and acked (acks %v, XPENDING %d)", w.acked(), pendingCount(cl.redisAddr, stream))
	}
	stop()
	if v := w.verdicts(); v[appended[0].ID] != 1 || v[appended[1].ID] != 1 {
		t.Fatalf("verdicts sent %v: want one each (none for the lost delivery)", v)
	}
}

func TestExplicitVerdictsAfterLeaseLostSendNothing(t *testing.T) {
	cl := fixture(t)
	stream := uniqueStream("go:lease-explicit")
	w := &wire{}
	conn, err := echomq.Dial(cl.listen, grpc.WithStreamInterceptor(w.intercept))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	appended := appendN(t, conn, stream, 1)
	type seen struct {
		cause                             error
		ack, fail, deadLetter, extend     error
		leaseLost, settled, attemptsFirst bool
	}
	first := make(chan seen, 1)
	calls := 0
	stop := runConsumer(t, echomq.ConsumerConfig{Conn: conn, Stream: stream, Concurrency: 1},
		func(ctx context.Context, d *echomq.Delivery) error {
			calls++
			if calls > 1 {
				return nil
			}
			steal(t, cl, stream, d.StreamID)
			select {
			case <-ctx.Done():
			case <-time.After(20 * time.Second):
			}
			first <- seen{
				cause: context.Cause(ctx), ack: d.Ack(), fail: d.Fail("x", 0), deadLetter: d.DeadLetter("x"),
				extend: d.Extend(time.Second), leaseLost: d.LeaseLost(), settled: d.Settled(), attemptsFirst: d.Attempts == 1,
			}
			return errors.New("would fail the entry, were the lease held")
		}, nil)
	var got seen
	select {
	case got = <-first:
	case <-time.After(30 * time.Second):
		t.Fatal("the handler did not finish")
	}
	for name, err := range map[string]error{"cause": got.cause, "Ack": got.ack, "Fail": got.fail, "DeadLetter": got.deadLetter, "Extend": got.extend} {
		if !errors.Is(err, echomq.ErrLeaseLost) {
			t.Errorf("%s: %v, want ErrLeaseLost", name, err)
		}
	}
	if !got.leaseLost || !got.settled || !got.attemptsFirst {
		t.Errorf("LeaseLost %v, Settled %v, first attempt %v; want all true", got.leaseLost, got.settled, got.attemptsFirst)
	}
	if err := waitFor(20*time.Second, func() bool { return pendingCount(cl.redisAddr, stream) == 0 && w.acked()[appended[0].ID] == 1 }); err != nil {
		t.Fatalf("not redelivered and acked: XPENDING %d", pendingCount(cl.redisAddr, stream))
	}
	stop()
	if v := w.verdicts(); v[appended[0].ID] != 1 {
		t.Fatalf("%d verdicts for the entry, want 1 (the redelivery's ack only)", v[appended[0].ID])
	}
}
