package echomq_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc"

	echomq "github.com/echomq/echomq-sidecar/clients/go"
)

// An entry a peer took (XCLAIM by "thief") while its handler ran gets no
// emits: the AckEmit is refused (LEASE_LOST), or, when the sidecar's lease
// refresh noticed first, never sent (ErrLeaseLost). Either way nothing is
// written, no Fail follows, and the entry stays the thief's.
func TestAckEmitOfAnEntryAPeerTookWritesNothing(t *testing.T) {
	cl := fixture(t)
	source, sink := uniqueStream("go:emit-stolen"), uniqueStream("go:emit-stolen-sink")
	conn, err := echomq.Dial(cl.listen)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	w := &wire{}
	conn2, err := echomq.Dial(cl.listen, grpc.WithStreamInterceptor(w.intercept))
	if err != nil {
		t.Fatal(err)
	}
	defer conn2.Close()
	if _, err := echomq.NewStreams(conn).Append(withTimeout(t, 10*time.Second), source, map[string][]byte{"n": []byte("1")}); err != nil {
		t.Fatal(err)
	}
	started, stolen := make(chan *echomq.Delivery, 1), make(chan struct{})
	outcome := make(chan error, 1)
	consumer := echomq.NewConsumer(echomq.ConsumerConfig{Conn: conn2, Stream: source, Group: "g", Start: echomq.StartBeginning()})
	done := make(chan error, 1)
	go func() {
		done <- consumer.Run(context.Background(), func(ctx context.Context, d *echomq.Delivery) error {
			started <- d
			<-stolen
			_, err := d.AckEmit(echomq.Emit{Stream: sink, Fields: map[string][]byte{"source": []byte(d.ID)}})
			outcome <- err
			return err
		})
	}()
	d := <-started
	if _, err := redisDo(cl.redisAddr, "XCLAIM", source, "g", "thief", "0", d.StreamID); err != nil {
		t.Fatal(err)
	}
	close(stolen)
	err = <-outcome
	var refused *echomq.AckEmitError
	switch {
	case errors.As(err, &refused):
		if refused.Code != echomq.CodeLeaseLost || refused.Held() {
			t.Errorf("refused with %v (held %v), want LEASE_LOST, not held", echomq.CodeName(refused.Code), refused.Held())
		}
	case errors.Is(err, echomq.ErrLeaseLost):
	default:
		t.Fatalf("AckEmit of a stolen entry: %v, want an AckEmitError LEASE_LOST or ErrLeaseLost", err)
	}
	if err := consumer.Stop(withTimeout(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := redisInt(t, cl.redisAddr, "XLEN", sink); n != 0 {
		t.Errorf("XLEN %s = %d, want 0: a call that lost its entry never writes its emits", sink, n)
	}
	if v := w.verdicts(); v[d.ID] != 0 {
		t.Errorf("%d Ack/Fail verdicts sent for the stolen entry, want none", v[d.ID])
	}
	reply, err := redisDo(cl.redisAddr, "XPENDING", source, "g", "-", "+", "10")
	if err != nil {
		t.Fatal(err)
	}
	if rows, _ := reply.([]any); len(rows) != 1 || rows[0].([]any)[1] != "thief" {
		t.Errorf("XPENDING %v, want the entry pending for thief only", reply)
	}
}
