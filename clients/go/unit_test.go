package echomq

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "github.com/echomq/echomq-sidecar/clients/go/echomqv1"
)

// recordingSender is a verdictSender that keeps what it was given.
type recordingSender struct {
	mu   sync.Mutex
	sent []*pb.ConsumeRequest
	err  error
}

func (r *recordingSender) send(req *pb.ConsumeRequest) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		return r.err
	}
	r.sent = append(r.sent, req)
	return nil
}

// ack records an ack as the one-id Ack message it stands for.
func (r *recordingSender) ack(id string) error {
	return r.send(&pb.ConsumeRequest{Kind: &pb.ConsumeRequest_Ack{Ack: &pb.Ack{Ids: []string{id}}}})
}

// ackEmit records the AckEmit and answers it as applied, with no entries.
func (r *recordingSender) ackEmit(req *pb.ConsumeRequest) (emitAnswer, error) {
	if err := r.send(req); err != nil {
		return emitAnswer{}, err
	}
	return emitAnswer{emitted: &pb.Emitted{Id: req.GetAckEmit().GetId()}}, nil
}

func (r *recordingSender) reheld() {}

func delivery(s verdictSender, id string) *Delivery {
	return newDelivery(s, &pb.Delivery{Id: id, StreamId: "1-0", Stream: "s", Group: "g", Attempts: 1})
}

func TestBackoffStaysInTheUpperHalfOfItsCeiling(t *testing.T) {
	b := Backoff{Initial: 100 * time.Millisecond, Max: time.Second}
	for attempt, ceiling := range []time.Duration{100, 200, 400, 800, 1000, 1000} {
		ceiling *= time.Millisecond
		if attempt == 5 {
			attempt = 100 // far past the cap must not overflow
		}
		for range 50 {
			d := b.Delay(attempt)
			if d < ceiling/2 || d > ceiling {
				t.Fatalf("attempt %d: delay %v outside [%v, %v]", attempt, d, ceiling/2, ceiling)
			}
		}
	}
	if d := (Backoff{}).Delay(0); d < DefaultReconnectInitial/2 || d > DefaultReconnectInitial {
		t.Fatalf("zero Backoff uses the defaults: got %v", d)
	}
}

func TestConfigWithoutStartIsRefused(t *testing.T) {
	cfg := ConsumerConfig{Target: "127.0.0.1:1", Stream: "s", Group: "g"}
	err := cfg.validate()
	if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "Start is required") {
		t.Fatalf("got %v", err)
	}
	cfg.Start = StartBeginning()
	if err := cfg.validate(); err != nil {
		t.Fatal(err)
	}
	// Run refuses it too, before dialling.
	err = NewConsumer(ConsumerConfig{Target: "127.0.0.1:1", Stream: "s", Group: "g"}).Run(context.Background(), func(context.Context, *Delivery) error { return nil })
	if !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("Run: got %v", err)
	}
}

func TestStartFillsTheSubscribe(t *testing.T) {
	at := time.Unix(1718000000, 0)
	for _, tc := range []struct {
		start Start
		check func(*pb.Subscribe) bool
	}{
		{StartNew(), func(s *pb.Subscribe) bool { return s.GroupStart == pb.GroupStart_GROUP_START_NEW }},
		{StartBeginning(), func(s *pb.Subscribe) bool { return s.GroupStart == pb.GroupStart_GROUP_START_BEGINNING }},
		{StartAfter("5-1"), func(s *pb.Subscribe) bool {
			return s.GroupStart == pb.GroupStart_GROUP_START_ID && s.StartId == "5-1"
		}},
		{StartAt(at), func(s *pb.Subscribe) bool {
			return s.GroupStart == pb.GroupStart_GROUP_START_INSTANT && s.StartTime.AsTime().Equal(at)
		}},
	} {
		cfg := ConsumerConfig{Stream: "s", Group: "g", Start: tc.start, MaxInFlight: 7, AckDeadline: time.Second}
		sub := cfg.subscribe().GetSubscribe()
		if !tc.check(sub) || sub.MaxInFlight != 7 || sub.AckDeadline.AsDuration() != time.Second {
			t.Errorf("%v: subscribe %v", tc.start, sub)
		}
	}
}

func TestPerKeyLimitsFillTheSubscribe(t *testing.T) {
	cfg := ConsumerConfig{Stream: "s", Group: "g", Start: StartNew(), KeyField: "customer", MaxInFlightPerKey: 2}
	sub := cfg.subscribe().GetSubscribe()
	if sub.GetKeyField() != "customer" || sub.GetMaxInFlightPerKey() != 2 {
		t.Errorf("subscribe %v", sub)
	}
	// Unset: nothing is sent, and the sidecar's checks are not duplicated here.
	unset := ConsumerConfig{Target: "127.0.0.1:1", Stream: "s", Group: "g", Start: StartNew(), KeyField: "customer"}
	if err := unset.validate(); err != nil {
		t.Errorf("validate: %v (the sidecar checks the per-key settings)", err)
	}
	if sub := unset.subscribe().GetSubscribe(); sub.GetMaxInFlightPerKey() != 0 {
		t.Errorf("subscribe %v", sub)
	}
}

func TestPermanentCodesAreNotRetried(t *testing.T) {
	for _, code := range []codes.Code{codes.InvalidArgument, codes.PermissionDenied, codes.Unauthenticated, codes.FailedPrecondition} {
		if !IsPermanent(code) {
			t.Errorf("%v should be permanent", code)
		}
	}
	for _, code := range []codes.Code{codes.Unavailable, codes.Canceled, codes.Internal, codes.Unknown, codes.DeadlineExceeded} {
		if IsPermanent(code) {
			t.Errorf("%v should be retried", code)
		}
	}
	c := NewConsumer(ConsumerConfig{Stream: "s", Group: "g"})
	err := c.callError(status.Error(codes.PermissionDenied, "no"))
	var refused *SubscriptionError
	if !errors.As(err, &refused) || status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), `stream "s"`) {
		t.Fatalf("got %v", err)
	}
	if errors.As(c.callError(status.Error(codes.Unavailable, "down")), &refused) {
		t.Fatal("UNAVAILABLE must be retried")
	}
}

func TestHandlerResultSettlesOnceAndExplicitSettlementWins(t *testing.T) {
	c := NewConsumer(ConsumerConfig{})
	for _, tc := range []struct {
		name    string
		handler Handler
		want    string
	}{
		{"nil acks", func(context.Context, *Delivery) error { return nil }, "ack"},
		{"error fails with its message", func(context.Context, *Delivery) error { return errors.New("boom") }, "fail:boom"},
		{"panic fails", func(context.Context, *Delivery) error { panic("oops") }, "fail:handler panicked: oops"},
		{"explicit fail then nil", func(_ context.Context, d *Delivery) error { return d.Fail("later", time.Second) }, "fail:later"},
		{"explicit dead letter then error", func(_ context.Context, d *Delivery) error {
			_ = d.DeadLetter("poison")
			return errors.New("ignored")
		}, "dead:poison"},
		{"second settlement refused", func(_ context.Context, d *Delivery) error {
			_ = d.Ack()
			if err := d.Fail("x", 0); !errors.Is(err, ErrAlreadySettled) {
				return errors.New("second settlement was accepted")
			}
			return nil
		}, "ack"},
	} {
		rec := &recordingSender{}
		c.handle(context.Background(), delivery(rec, "0000000000010000000000000001"), tc.handler)
		if len(rec.sent) != 1 {
			t.Errorf("%s: %d verdicts sent, want 1", tc.name, len(rec.sent))
			continue
		}
		var got string
		switch m := rec.sent[0].GetKind().(type) {
		case *pb.ConsumeRequest_Ack:
			got = "ack"
		case *pb.ConsumeRequest_Fail:
			got = "fail:" + m.Fail.Reason
			if m.Fail.DeadLetter {
				got = "dead:" + m.Fail.Reason
			}
		}
		if got != tc.want {
			t.Errorf("%s: sent %s, want %s", tc.name, got, tc.want)
		}
	}
}

func TestFailWithoutDelayLeavesRetryAfterUnset(t *testing.T) {
	rec := &recordingSender{}
	_ = delivery(rec, "a").Fail("r", 0)
	_ = delivery(rec, "b").Fail("r", 300*time.Millisecond)
	if rec.sent[0].GetFail().RetryAfter != nil {
		t.Error("Fail(…, 0) must leave retry_after unset (the subscription's backoff)")
	}
	if rec.sent[1].GetFail().RetryAfter.AsDuration() != 300*time.Millisecond {
		t.Error("Fail(…, 300ms) must send retry_after 300ms")
	}
}

func TestEveryFailCarriesTheKindItMeans(t *testing.T) {
	c := NewConsumer(ConsumerConfig{})
	dbDown := errors.New("the database is down")
	for _, tc := range []struct {
		name       string
		handler    Handler
		kind       FailKind
		deadLetter bool
	}{
		{"an error is the message's fault", func(context.Context, *Delivery) error { return dbDown }, FailKindMessage, false},
		{"Transient", func(context.Context, *Delivery) error { return Transient(dbDown) }, FailKindTransient, false},
		{"Transient wrapped again", func(context.Context, *Delivery) error {
			return fmt.Errorf("saving: %w", Transient(dbDown))
		}, FailKindTransient, false},
		{"Poison", func(context.Context, *Delivery) error { return Poison(errors.New("not JSON")) }, FailKindPoison, false},
		{"the outermost kind wins", func(context.Context, *Delivery) error { return Poison(Transient(dbDown)) }, FailKindPoison, false},
		{"explicit Fail without a kind", func(_ context.Context, d *Delivery) error { return d.Fail("x", 0) }, FailKindMessage, false},
		{"explicit transient Fail", func(_ context.Context, d *Delivery) error {
			return d.Fail("rate limited", time.Second, FailKindTransient)
		}, FailKindTransient, false},
		{"explicit poison Fail", func(_ context.Context, d *Delivery) error { return d.Fail("x", 0, FailKindPoison) }, FailKindPoison, false},
		{"DeadLetter is poison, with the old flag", func(_ context.Context, d *Delivery) error { return d.DeadLetter("x") }, FailKindPoison, true},
	} {
		rec := &recordingSender{}
		c.handle(context.Background(), delivery(rec, "0000000000010000000000000001"), tc.handler)
		if len(rec.sent) != 1 || rec.sent[0].GetFail() == nil {
			t.Errorf("%s: sent %v, want one Fail", tc.name, rec.sent)
			continue
		}
		if f := rec.sent[0].GetFail(); f.GetKind() != tc.kind || f.GetDeadLetter() != tc.deadLetter {
			t.Errorf("%s: sent kind %v dead_letter %v, want %v %v", tc.name, f.GetKind(), f.GetDeadLetter(), tc.kind, tc.deadLetter)
		}
	}
}

func TestTransientAndPoisonKeepTheErrorAndNil(t *testing.T) {
	dbDown := errors.New("the database is down")
	if Transient(nil) != nil || Poison(nil) != nil {
		t.Error("Transient(nil) and Poison(nil) must be nil, so that returning them acks")
	}
	err := Transient(dbDown)
	var transient *TransientError
	if !errors.Is(err, dbDown) || !errors.As(err, &transient) || err.Error() != dbDown.Error() {
		t.Errorf("Transient(err) = %v: must wrap err, be a *TransientError and keep its message", err)
	}
}

func TestFailRefusesTwoKindsAndSendsNothing(t *testing.T) {
	rec := &recordingSender{}
	d := delivery(rec, "a")
	if err := d.Fail("x", 0, FailKindTransient, FailKindPoison); err == nil || d.Settled() || len(rec.sent) != 0 {
		t.Fatalf("Fail with two kinds: err %v, settled %v, sent %d; want an error, unsettled, nothing", err, d.Settled(), len(rec.sent))
	}
}

func TestABatchHandlersErrorsCarryTheirKind(t *testing.T) {
	c := NewConsumer(ConsumerConfig{})
	rec := &recordingSender{}
	batch := []*Delivery{delivery(rec, "a"), delivery(rec, "b"), delivery(rec, "c")}
	c.handleBatch(context.Background(), batch, func(context.Context, []*Delivery) []error {
		return []error{Transient(errors.New("down")), Poison(errors.New("bad")), errors.New("failed")}
	})
	var got []FailKind
	for _, m := range rec.sent {
		got = append(got, m.GetFail().GetKind())
	}
	if want := []FailKind{FailKindTransient, FailKindPoison, FailKindMessage}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("kinds %v, want %v", got, want)
	}
}

// fakeStream is the client side of a Consume call that records what is sent.
type fakeStream struct {
	grpc.ClientStream
	mu         sync.Mutex
	sent       []*pb.ConsumeRequest
	halfClosed bool
}

func (f *fakeStream) Send(m *pb.ConsumeRequest) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sent = append(f.sent, m)
	return nil
}

func (f *fakeStream) CloseSend() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.halfClosed = true
	return nil
}

func (f *fakeStream) Recv() (*pb.ConsumeResponse, error) { select {} }

func TestSenderFoldsQueuedAcksAndHalfClosesLast(t *testing.T) {
	c := NewConsumer(ConsumerConfig{Concurrency: 1})
	stream := &fakeStream{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	k := newCall(c, stream, ctx, cancel, 64)
	k.held.Store(5) // the five deliveries below, as receive counts them
	for _, id := range []string{"a", "b", "c"} {
		_ = delivery(k, id).Ack()
	}
	_ = delivery(k, "d").Fail("x", 0)
	_ = delivery(k, "e").Ack()
	k.sendClosed.Store(true)
	_ = k.push(outgoing{req: closeMarker}, nil)
	k.sendLoop()
	if len(stream.sent) != 3 || !stream.halfClosed {
		t.Fatalf("sent %v, half-closed %v", stream.sent, stream.halfClosed)
	}
	if ids := stream.sent[0].GetAck().GetIds(); strings.Join(ids, ",") != "a,b,c" {
		t.Errorf("first message acks %v, want a,b,c", ids)
	}
	if stream.sent[1].GetFail().GetId() != "d" || stream.sent[2].GetAck().GetIds()[0] != "e" {
		t.Errorf("order lost: %v", stream.sent)
	}
	if err := delivery(k, "f").Ack(); !errors.Is(err, ErrCallEnded) {
		t.Errorf("a verdict after the half-close: %v, want ErrCallEnded", err)
	}
}

func TestVerdictOfAnEndedCallIsDropped(t *testing.T) {
	c := NewConsumer(ConsumerConfig{Concurrency: 1})
	ctx, cancel := context.WithCancel(context.Background())
	k := newCall(c, &fakeStream{}, ctx, cancel, 1)
	d := delivery(k, "a")
	cancel() // the call broke; a reconnect opens a new call
	if err := d.Ack(); !errors.Is(err, ErrCallEnded) {
		t.Fatalf("got %v, want ErrCallEnded", err)
	}
	if len(k.out.items) != 0 {
		t.Fatal("a verdict of an ended call was queued")
	}
}

func TestStopBeforeRunMakesRunReturnAtOnce(t *testing.T) {
	c := NewConsumer(ConsumerConfig{Target: "127.0.0.1:1", Stream: "s", Group: "g", Start: StartNew()})
	if err := c.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Run(context.Background(), func(context.Context, *Delivery) error { return nil }) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return")
	}
	if err := c.Run(context.Background(), func(context.Context, *Delivery) error { return nil }); !errors.Is(err, ErrRunTwice) {
		t.Fatalf("second Run: %v", err)
	}
}

func TestSkipSeenHandlesEachIDOnce(t *testing.T) {
	store := NewMemorySeenStore(0)
	calls := 0
	h := SkipSeen(store, func(context.Context, *Delivery) error { calls++; return nil })
	rec := &recordingSender{}
	for range 3 {
		if err := h(context.Background(), delivery(rec, "0000000000010000000000000001")); err != nil {
			t.Fatal(err)
		}
	}
	if calls != 1 {
		t.Fatalf("handled %d times, want 1", calls)
	}
	// A failed delivery is not recorded: its retry is handled.
	failing := SkipSeen(store, func(_ context.Context, d *Delivery) error { return d.Fail("no", 0) })
	_ = failing(context.Background(), delivery(rec, "0000000000020000000000000001"))
	if seen, _ := store.Seen(context.Background(), "0000000000020000000000000001"); seen {
		t.Fatal("a failed delivery was recorded as seen")
	}
	// Nor is one whose lease was lost while it ran, even if it returned nil.
	gaveUp := SkipSeen(store, func(_ context.Context, d *Delivery) error { d.lose(); return nil })
	_ = gaveUp(context.Background(), delivery(rec, "0000000000030000000000000001"))
	if seen, _ := store.Seen(context.Background(), "0000000000030000000000000001"); seen {
		t.Fatal("a delivery whose lease was lost was recorded as seen")
	}
	versions := NewMemoryVersionStore()
	newer := NewerWins(versions, func(*Delivery) string { return "k" }, func(_ context.Context, d *Delivery) error { d.lose(); return nil })
	_ = newer(context.Background(), delivery(rec, "0000000000030000000000000001"))
	if latest, _ := versions.Latest(context.Background(), "k"); latest != "" {
		t.Fatalf("a delivery whose lease was lost advanced its key to %s", latest)
	}
}

func TestMemorySeenForgetsTheOldestBeyondItsLimit(t *testing.T) {
	ctx := context.Background()
	s := NewMemorySeenStore(2)
	for _, id := range []string{"a", "b", "c"} {
		_ = s.Record(ctx, id)
	}
	for id, want := range map[string]bool{"a": false, "b": true, "c": true} {
		if got, _ := s.Seen(ctx, id); got != want {
			t.Errorf("Seen(%s) = %v, want %v", id, got, want)
		}
	}
}

func TestNewerWinsSkipsOlderAndEqualIDs(t *testing.T) {
	store := NewMemoryVersionStore()
	var applied []string
	h := NewerWins(store, func(d *Delivery) string { return string(d.Payload["key"]) },
		func(_ context.Context, d *Delivery) error { applied = append(applied, d.ID); return nil })
	rec := &recordingSender{}
	for _, id := range []string{
		"0000000000020000000000000000", // applied
		"0000000000010000000000000005", // older: skipped (a stale replay)
		"0000000000020000000000000000", // equal: skipped (a redelivery)
		"0000000000020000000000000001", // newer: applied
	} {
		d := delivery(rec, id)
		d.Payload = map[string][]byte{"key": []byte("order-1")}
		if err := h(context.Background(), d); err != nil {
			t.Fatal(err)
		}
	}
	if strings.Join(applied, ",") != "0000000000020000000000000000,0000000000020000000000000001" {
		t.Fatalf("applied %v", applied)
	}
}

func TestBrandedIDsParseAndOrderLikeTheStream(t *testing.T) {
	ms, seq, err := ParseBrandedID("0190000000000000000000000003")
	if err != nil || ms != 0x019000000000 || seq != 3 {
		t.Fatalf("got %x %d %v", ms, seq, err)
	}
	for _, bad := range []string{
		"",
		"01900000000000000000000000",     // 26 characters
		"019000000000000000000000000g",   // not hex
		"019000000000000000000000000A",   // uppercase
		"01900000000000000000000000000a", // 30 characters
	} {
		if _, _, err := ParseBrandedID(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	if !IsNewer("0000000000010000000000000000", "0000000000000fffffffffffffff") || !IsNewer("0000000000000000000000000000", "") {
		t.Error("IsNewer does not follow stream order")
	}
}

func TestCodeNameIsTheShortName(t *testing.T) {
	if CodeName(CodeUnknownID) != "UNKNOWN_ID" || CodeName(CodeNotPending) != "NOT_PENDING" {
		t.Fatal(CodeName(CodeUnknownID))
	}
}

func (f *fakeStream) acks() [][]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out [][]string
	for _, m := range f.sent {
		if a := m.GetAck(); a != nil {
			out = append(out, a.GetIds())
		}
	}
	return out
}

// senderCall is a call on a fakeStream with its sender running, holding held
// deliveries.
func senderCall(t *testing.T, cfg ConsumerConfig, maxInFlight int, held int64) (*call, *fakeStream, context.CancelFunc) {
	t.Helper()
	c := NewConsumer(cfg)
	stream := &fakeStream{}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	k := newCall(c, stream, ctx, cancel, maxInFlight)
	k.held.Store(held)
	done := make(chan struct{})
	go func() { defer close(done); k.sendLoop() }()
	t.Cleanup(func() { cancel(); <-done })
	return k, stream, cancel
}

func TestAcksLingerIntoOneMessage(t *testing.T) {
	k, stream, _ := senderCall(t, ConsumerConfig{AckLinger: 80 * time.Millisecond}, 1000, 100)
	for _, id := range []string{"a", "b", "c"} {
		if err := delivery(k, id).Ack(); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(20 * time.Millisecond)
	if got := stream.acks(); len(got) != 0 {
		t.Fatalf("acks sent before the linger ended: %v", got)
	}
	if err := waitForUnit(2*time.Second, func() bool { return len(stream.acks()) == 1 }); err != nil {
		t.Fatalf("after the linger: %v, want one Ack message", stream.acks())
	}
	if ids := strings.Join(stream.acks()[0], ","); ids != "a,b,c" {
		t.Fatalf("one Ack of %s, want a,b,c", ids)
	}
}

func TestAckBatchBoundsOneMessage(t *testing.T) {
	k, stream, _ := senderCall(t, ConsumerConfig{AckLinger: time.Hour, AckBatch: 4}, 1000, 100)
	for i := range 9 {
		_ = delivery(k, strconv.Itoa(i)).Ack()
	}
	if err := waitForUnit(2*time.Second, func() bool { return len(stream.acks()) == 2 }); err != nil {
		t.Fatalf("acks %v, want two messages of 4", stream.acks())
	}
	time.Sleep(20 * time.Millisecond)
	got := stream.acks()
	if len(got) != 2 || len(got[0]) != 4 || len(got[1]) != 4 {
		t.Fatalf("acks %v, want two messages of 4 and the ninth still waiting", got)
	}
}

func TestAckBatchIsAtMostAQuarterOfTheCredit(t *testing.T) {
	k, stream, _ := senderCall(t, ConsumerConfig{AckLinger: time.Hour}, 8, 100)
	for _, id := range []string{"a", "b", "c"} {
		_ = delivery(k, id).Ack()
	}
	if err := waitForUnit(2*time.Second, func() bool { return len(stream.acks()) == 1 }); err != nil || len(stream.acks()[0]) != 2 {
		t.Fatalf("acks %v, want a message of 2 (max_in_flight 8 / 4)", stream.acks())
	}
}

func TestAcksGoOutAtOnceWhenEveryHeldDeliveryIsAcked(t *testing.T) {
	k, stream, _ := senderCall(t, ConsumerConfig{AckLinger: time.Hour}, 1000, 2)
	_ = delivery(k, "a").Ack()
	_ = delivery(k, "b").Ack()
	if err := waitForUnit(2*time.Second, func() bool { return len(stream.acks()) == 1 }); err != nil {
		t.Fatalf("acks %v: nothing else is held, so waiting gains nothing", stream.acks())
	}
	if ids := strings.Join(stream.acks()[0], ","); ids != "a,b" {
		t.Fatalf("one Ack of %s, want a,b", ids)
	}
}

func TestCoalescedAcksOfAnEndedCallAreNeverSent(t *testing.T) {
	k, stream, cancel := senderCall(t, ConsumerConfig{AckLinger: time.Hour}, 1000, 100)
	_ = delivery(k, "a").Ack()
	time.Sleep(20 * time.Millisecond)
	cancel() // the call broke while "a" waited
	time.Sleep(20 * time.Millisecond)
	if got := stream.acks(); len(got) != 0 {
		t.Fatalf("acks %v sent after the call ended", got)
	}
}

func TestBatchVerdictsSettleEachDelivery(t *testing.T) {
	c := NewConsumer(ConsumerConfig{})
	batch := func(rec *recordingSender, ids ...string) []*Delivery {
		var out []*Delivery
		for _, id := range ids {
			out = append(out, delivery(rec, id))
		}
		return out
	}
	verdicts := func(rec *recordingSender) string {
		var out []string
		for _, m := range rec.sent {
			if a := m.GetAck(); a != nil {
				out = append(out, "ack:"+a.GetIds()[0])
			} else if f := m.GetFail(); f != nil {
				out = append(out, "fail:"+f.GetId()+":"+f.GetReason())
			}
		}
		return strings.Join(out, " ")
	}
	cases := []struct {
		name string
		h    BatchHandler
		want string
	}{
		{"nil acks all", func(context.Context, []*Delivery) []error { return nil }, "ack:a ack:b ack:c"},
		{"one verdict each", func(context.Context, []*Delivery) []error {
			return []error{nil, errors.New("bad"), nil}
		}, "ack:a fail:b:bad ack:c"},
		{"explicit settlement wins", func(_ context.Context, b []*Delivery) []error {
			_ = b[0].DeadLetter("poison")
			return []error{nil, nil, nil}
		}, "fail:a:poison ack:b ack:c"},
		{"wrong length fails the rest", func(_ context.Context, b []*Delivery) []error {
			_ = b[1].Ack()
			return []error{nil}
		}, "ack:b fail:a:batch handler returned 1 verdicts for 3 deliveries fail:c:batch handler returned 1 verdicts for 3 deliveries"},
		{"panic fails all", func(context.Context, []*Delivery) []error { panic("boom") }, "fail:a:batch handler panicked: boom fail:b:batch handler panicked: boom fail:c:batch handler panicked: boom"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec := &recordingSender{}
			c.handleBatch(context.Background(), batch(rec, "a", "b", "c"), tc.h)
			if got := verdicts(rec); got != tc.want {
				t.Fatalf("verdicts %q, want %q", got, tc.want)
			}
		})
	}
}

func TestSubscribeAsksForBatches(t *testing.T) {
	for _, tc := range []struct {
		cfg  ConsumerConfig
		want uint32
	}{
		{ConsumerConfig{}, DefaultMaxBatch},
		{ConsumerConfig{MaxInFlight: 32}, 32},
		{ConsumerConfig{MaxInFlight: 1000}, DefaultMaxBatch},
		{ConsumerConfig{MaxBatch: 1}, 1},
		{ConsumerConfig{MaxBatch: 1000, MaxInFlight: 10}, 1000},
	} {
		cfg := tc.cfg
		cfg.Stream, cfg.Group, cfg.Start = "s", "g", StartNew()
		if got := cfg.subscribe().GetSubscribe().GetMaxBatch(); got != tc.want {
			t.Errorf("MaxBatch %d MaxInFlight %d: max_batch %d, want %d", tc.cfg.MaxBatch, tc.cfg.MaxInFlight, got, tc.want)
		}
	}
}

func TestFlowControlAndItsDeprecatedFlatFieldsAskTheSame(t *testing.T) {
	grouped := ConsumerConfig{Stream: "s", Group: "g", Start: StartNew(), FlowControl: FlowControl{MaxInFlight: 12, Concurrency: 3, MaxBatch: 5}}
	flat := ConsumerConfig{Stream: "s", Group: "g", Start: StartNew(), MaxInFlight: 12, Concurrency: 3, MaxBatch: 5}
	if !proto.Equal(grouped.subscribe(), flat.subscribe()) || grouped.flow() != flat.flow() {
		t.Fatalf("FlowControl %v and the flat fields %v differ", grouped.subscribe(), flat.subscribe())
	}
	both := ConsumerConfig{Target: "x", Stream: "s", Group: "g", Start: StartNew(), MaxInFlight: 4, FlowControl: FlowControl{MaxInFlight: 4}}
	if err := both.validate(); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "FlowControl only") {
		t.Fatalf("both set: %v, want ErrInvalidConfig naming FlowControl", err)
	}
}

func waitForUnit(limit time.Duration, ok func() bool) error {
	deadline := time.Now().Add(limit)
	for !ok() {
		if time.Now().After(deadline) {
			return errors.New("timed out")
		}
		time.Sleep(5 * time.Millisecond)
	}
	return nil
}

func TestALostLeaseEndsSettlementAndAnEarlierVerdictStands(t *testing.T) {
	c := NewConsumer(ConsumerConfig{})
	rec := &recordingSender{}
	d := delivery(rec, "0000000000010000000000000001")
	if !d.lose() || !d.LeaseLost() || !d.Settled() {
		t.Fatal("lose on an unsettled delivery must mark it lost")
	}
	for name, err := range map[string]error{
		"Ack": d.Ack(), "Fail": d.Fail("x", 0), "DeadLetter": d.DeadLetter("x"), "Extend": d.Extend(time.Second),
	} {
		if !errors.Is(err, ErrLeaseLost) {
			t.Errorf("%s after a lost lease: %v, want ErrLeaseLost", name, err)
		}
	}
	c.handle(context.Background(), d, func(context.Context, *Delivery) error { return errors.New("ignored") })
	if len(rec.sent) != 0 {
		t.Fatalf("%d verdicts sent for a lost delivery, want none", len(rec.sent))
	}

	acked := delivery(rec, "0000000000010000000000000002")
	_ = acked.Ack()
	if acked.lose() || acked.LeaseLost() {
		t.Fatal("a lost lease after the ack must leave the ack standing")
	}
	if len(rec.sent) != 1 {
		t.Fatalf("%d verdicts, want the ack", len(rec.sent))
	}
}

// The default handler concurrency is 64, not the cap of the adaptive window
// (1024 goroutines, mostly idle); a set MaxInFlight still sizes the pool; a
// sidecar whose cap is below 64 bounds it; the queue is bounded by the cap.
func TestDefaultConcurrencyIs64NotTheAdaptiveCap(t *testing.T) {
	cases := []struct {
		name          string
		flow          FlowControl
		effective     int
		workers, room int
	}{
		{"nothing set, the default cap", FlowControl{}, DefaultMaxInFlight, DefaultConcurrency, DefaultMaxInFlight},
		{"nothing set, a cap below 64", FlowControl{}, 5, 5, 5},
		{"max_in_flight set", FlowControl{MaxInFlight: 200}, 200, 200, 200},
		{"concurrency set", FlowControl{Concurrency: 100}, DefaultMaxInFlight, 100, DefaultMaxInFlight},
	}
	if DefaultConcurrency != 64 || DefaultMaxInFlight != 1024 {
		t.Fatalf("DefaultConcurrency %d, DefaultMaxInFlight %d; clients/CONTRACT.md says 64 and 1024", DefaultConcurrency, DefaultMaxInFlight)
	}
	for _, tc := range cases {
		c := NewConsumer(ConsumerConfig{FlowControl: tc.flow})
		p := c.startPool(tc.effective)
		if len(p.workers) != tc.workers || p.limit != tc.room {
			t.Errorf("%s: %d workers, queue bound %d; want %d, %d", tc.name, len(p.workers), p.limit, tc.workers, tc.room)
		}
		p.stop()
	}
}
