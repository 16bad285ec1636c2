package echomq_test

// Batched frames and coalesced acks, against the shared fixture: what the
// wire carries is counted by a stream interceptor, what Redis holds by XPENDING.

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	echomq "github.com/echomq/echomq-sidecar/clients/go"
	pb "github.com/echomq/echomq-sidecar/clients/go/echomqv1"
)

// wire records the Consume frames a connection receives and the Subscribe and
// Ack messages it sends (over every call of the connection).
type wire struct {
	mu         sync.Mutex
	subscribes int
	// frames holds the ids of each delivery frame, in arrival order; batch
	// whether it was a DeliveryBatch.
	frames [][]string
	batch  []bool
	// ackMsgs holds the ids of each Ack message sent; failIDs the id of each
	// Fail sent.
	ackMsgs [][]string
	failIDs []string
	// ackEmitIDs holds the id of each AckEmit sent.
	ackEmitIDs []string
	// releasedIDs holds the ids of every Release sent, in order.
	releasedIDs []string
	// sentMax holds the max_in_flight of each Subscribe sent, subscribedMax
	// that of each Subscribed received.
	sentMax       []uint32
	subscribedMax []uint32
	// peakUnsettled is the most deliveries one call had received and sent
	// no verdict for, at any moment: a lower bound of the sidecar's window.
	peakUnsettled int
}

func (w *wire) intercept(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	cs, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil {
		return nil, err
	}
	return &wireStream{ClientStream: cs, w: w}, nil
}

type wireStream struct {
	grpc.ClientStream
	w *wire
	// unsettled counts this call's deliveries received minus the verdicts
	// sent. A verdict counts before it is sent and a delivery after it
	// arrived, so this never exceeds what the sidecar holds for the call.
	unsettled int
}

func (s *wireStream) SendMsg(m any) error {
	if req, ok := m.(*pb.ConsumeRequest); ok {
		s.w.mu.Lock()
		s.unsettled -= len(req.GetAck().GetIds()) + len(req.GetRelease().GetIds())
		if req.GetFail() != nil || req.GetAckEmit() != nil {
			s.unsettled--
		}
		s.w.mu.Unlock()
	}
	err := s.ClientStream.SendMsg(m)
	if req, ok := m.(*pb.ConsumeRequest); ok && err == nil {
		s.w.mu.Lock()
		if req.GetSubscribe() != nil {
			s.w.subscribes++
			s.w.sentMax = append(s.w.sentMax, req.GetSubscribe().GetMaxInFlight())
		}
		if req.GetAck() != nil {
			s.w.ackMsgs = append(s.w.ackMsgs, slices.Clone(req.GetAck().GetIds()))
		}
		if req.GetFail() != nil {
			s.w.failIDs = append(s.w.failIDs, req.GetFail().GetId())
		}
		if req.GetAckEmit() != nil {
			s.w.ackEmitIDs = append(s.w.ackEmitIDs, req.GetAckEmit().GetId())
		}
		s.w.releasedIDs = append(s.w.releasedIDs, req.GetRelease().GetIds()...)
		s.w.mu.Unlock()
	}
	return err
}

func (s *wireStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	resp, ok := m.(*pb.ConsumeResponse)
	if !ok || err != nil {
		return err
	}
	var ids []string
	isBatch := false
	if d := resp.GetDelivery(); d != nil {
		ids = []string{d.GetId()}
	} else if b := resp.GetBatch(); b != nil {
		isBatch = true
		for _, d := range b.GetDeliveries() {
			ids = append(ids, d.GetId())
		}
	} else {
		if sub := resp.GetSubscribed(); sub != nil {
			s.w.mu.Lock()
			s.w.subscribedMax = append(s.w.subscribedMax, sub.GetMaxInFlight())
			s.w.mu.Unlock()
		}
		return err
	}
	s.w.mu.Lock()
	s.unsettled += len(ids)
	s.w.peakUnsettled = max(s.w.peakUnsettled, s.unsettled)
	s.w.frames = append(s.w.frames, ids)
	s.w.batch = append(s.w.batch, isBatch)
	s.w.mu.Unlock()
	return err
}

func (w *wire) received() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, f := range w.frames {
		n += len(f)
	}
	return n
}

// released counts, per branded id, the ids sent in Release messages.
func (w *wire) released() map[string]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := map[string]int{}
	for _, id := range w.releasedIDs {
		out[id]++
	}
	return out
}

func (w *wire) acked() map[string]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := map[string]int{}
	for _, m := range w.ackMsgs {
		for _, id := range m {
			out[id]++
		}
	}
	return out
}

// ackEmits counts the AckEmit messages sent.
func (w *wire) ackEmits() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.ackEmitIDs)
}

// verdicts counts the Ack and Fail messages sent naming each id.
func (w *wire) verdicts() map[string]int {
	out := w.acked()
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, id := range w.failIDs {
		out[id]++
	}
	return out
}

// flow returns the max_in_flight of every Subscribed received and the peak
// of deliveries held un-settled by one call.
func (w *wire) flow() ([]uint32, int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.subscribedMax), w.peakUnsettled
}

// sentMaxInFlight returns the max_in_flight of every Subscribe sent.
func (w *wire) sentMaxInFlight() []uint32 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.sentMax)
}

func (w *wire) subscribed() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.subscribes
}

// stopRun stops consumer gracefully and checks that its Run (done) returned nil.
func stopRun(t *testing.T, consumer *echomq.Consumer, done <-chan error) {
	t.Helper()
	if err := consumer.Stop(withTimeout(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func (w *wire) ackMessages() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.ackMsgs)
}

// batchSetup appends n entries (field n = 0…n-1) to a fresh stream and dials
// the fixture with a wire recorder.
func batchSetup(t *testing.T, prefix string, n int) (cl *cluster, stream string, w *wire, conn *grpc.ClientConn, ids []string) {
	t.Helper()
	cl = fixture(t)
	stream = uniqueStream(prefix)
	w = &wire{}
	conn, err := echomq.Dial(cl.listen, grpc.WithStreamInterceptor(w.intercept))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	entries := make([]map[string][]byte, n)
	for i := range entries {
		entries[i] = map[string][]byte{"n": []byte(strconv.Itoa(i))}
	}
	appended, err := echomq.NewStreams(conn).AppendBatch(withTimeout(t, 10*time.Second), stream, entries)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range appended {
		ids = append(ids, a.ID)
	}
	return cl, stream, w, conn, ids
}

// pendingCount is XPENDING's count, or -1 before the group exists.
func pendingCount(addr, stream string) int64 {
	reply, err := redisDo(addr, "XPENDING", stream, "g")
	if err != nil {
		return -1
	}
	if v, ok := reply.([]any); ok && len(v) > 0 {
		if n, ok := v[0].(int64); ok {
			return n
		}
	}
	return -1
}

// pendingIDs lists the branded ids of the group's pending entries, through
// the entries' stream ids.
func pendingIDs(t *testing.T, addr, stream string, byStreamID map[string]string) map[string]bool {
	t.Helper()
	reply, err := redisDo(addr, "XPENDING", stream, "g", "-", "+", "10000")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, row := range reply.([]any) {
		out[byStreamID[row.([]any)[0].(string)]] = true
	}
	return out
}

func TestBatchFramesAreSettledWithFewAckMessages(t *testing.T) {
	const n, maxBatch = 600, 64
	cl, stream, w, conn, ids := batchSetup(t, "go:batches", n)
	var mu sync.Mutex
	handled := map[string]int{}
	consumer := echomq.NewConsumer(echomq.ConsumerConfig{
		Conn: conn, Stream: stream, Group: "g", Start: echomq.StartBeginning(),
		MaxInFlight: 256, MaxBatch: maxBatch,
	})
	done := make(chan error, 1)
	go func() {
		done <- consumer.Run(context.Background(), func(_ context.Context, d *echomq.Delivery) error {
			mu.Lock()
			handled[d.ID]++
			mu.Unlock()
			return nil
		})
	}()
	if err := waitFor(30*time.Second, func() bool { return pendingCount(cl.redisAddr, stream) == 0 && w.received() >= n }); err != nil {
		t.Fatalf("received %d of %d, XPENDING %d", w.received(), n, pendingCount(cl.redisAddr, stream))
	}
	stopRun(t, consumer, done)

	w.mu.Lock()
	defer w.mu.Unlock()
	biggest := 0
	for i, f := range w.frames {
		if !w.batch[i] {
			t.Fatalf("frame %d is a single Delivery: the consumer must ask for batches", i)
		}
		if len(f) > maxBatch {
			t.Fatalf("frame %d holds %d deliveries, above max_batch %d", i, len(f), maxBatch)
		}
		biggest = max(biggest, len(f))
	}
	if biggest < 2 {
		t.Fatalf("%d frames, none with more than one delivery", len(w.frames))
	}
	mu.Lock()
	defer mu.Unlock()
	for _, id := range ids {
		if handled[id] != 1 {
			t.Fatalf("%s handled %d times, want once", id, handled[id])
		}
	}
	acked := 0
	most := 0
	for _, m := range w.ackMsgs {
		acked += len(m)
		most = max(most, len(m))
	}
	if acked != n {
		t.Fatalf("%d ids acked in Ack messages, want %d (each once)", acked, n)
	}
	// One Ack per delivery would be 600 messages; coalesced, a message carries
	// up to a quarter of the 256 credit.
	if len(w.ackMsgs) > n/8 || most < 8 {
		t.Fatalf("%d Ack messages for %d ids (at most %d in one): acks are not coalesced", len(w.ackMsgs), n, most)
	}
	t.Logf("%d frames (largest %d), %d Ack messages (largest %d ids)", len(w.frames), biggest, len(w.ackMsgs), most)
}

func TestSingleFramesWhenMaxBatchIsOne(t *testing.T) {
	const n = 20
	cl, stream, w, conn, _ := batchSetup(t, "go:single-frames", n)
	consumer := echomq.NewConsumer(echomq.ConsumerConfig{Conn: conn, Stream: stream, Group: "g", Start: echomq.StartBeginning(), MaxBatch: 1})
	done := make(chan error, 1)
	go func() {
		done <- consumer.Run(context.Background(), func(context.Context, *echomq.Delivery) error { return nil })
	}()
	if err := waitFor(20*time.Second, func() bool { return w.received() >= n && pendingCount(cl.redisAddr, stream) == 0 }); err != nil {
		t.Fatalf("received %d of %d", w.received(), n)
	}
	stopRun(t, consumer, done)
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := range w.frames {
		if w.batch[i] {
			t.Fatalf("frame %d is a DeliveryBatch with MaxBatch 1", i)
		}
	}
}

// The acks of a graceful stop are coalesced until the stop itself sends them:
// with a long linger and more deliveries held than acked, nothing else would.
func TestStopFlushesCoalescedAcks(t *testing.T) {
	const n, handledBeforeStop = 20, 10
	cl, stream, w, conn, ids := batchSetup(t, "go:stop-flush", n)
	consumer := echomq.NewConsumer(echomq.ConsumerConfig{
		Conn: conn, Stream: stream, Group: "g", Start: echomq.StartBeginning(),
		MaxInFlight: 400, Concurrency: 1, AckLinger: time.Hour,
	})
	var mu sync.Mutex
	var handled []string
	stopped := make(chan error, 1)
	acksBeforeStop, pendingBeforeStop := -1, int64(-1)
	done := make(chan error, 1)
	go func() {
		done <- consumer.Run(context.Background(), func(_ context.Context, d *echomq.Delivery) error {
			if err := waitFor(10*time.Second, func() bool { return w.received() >= n }); err != nil {
				return errors.New("not every entry arrived")
			}
			mu.Lock()
			handled = append(handled, d.ID)
			last := len(handled) == handledBeforeStop
			mu.Unlock()
			if last {
				// Time for the sender to send what it would; with the hour-long
				// linger and 20 held for 9 acked, it must send nothing.
				time.Sleep(100 * time.Millisecond)
				acksBeforeStop = w.ackMessages()
				pendingBeforeStop = pendingCount(cl.redisAddr, stream)
				go func() { stopped <- consumer.Stop(withTimeout(t, 10*time.Second)) }()
				time.Sleep(100 * time.Millisecond) // Stop has begun: no new handler starts
			}
			return nil
		})
	}()
	var err error
	select {
	case err = <-stopped:
	case <-time.After(20 * time.Second):
		t.Fatal("Stop was not called or did not return")
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if acksBeforeStop != 0 || pendingBeforeStop != n {
		t.Fatalf("%d Ack messages and %d pending before Stop, want 0 and %d: the acks must wait for the linger", acksBeforeStop, pendingBeforeStop, n)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(handled) != handledBeforeStop {
		t.Fatalf("%d handled, want %d: Stop must start no new handler", len(handled), handledBeforeStop)
	}
	byStreamID := streamIDs(t, cl.redisAddr, stream)
	if err := waitFor(5*time.Second, func() bool {
		return len(pendingIDs(t, cl.redisAddr, stream, byStreamID)) == n-handledBeforeStop
	}); err != nil {
		t.Fatalf("pending %d after Stop, want %d: the acks of the handled entries were not flushed",
			len(pendingIDs(t, cl.redisAddr, stream, byStreamID)), n-handledBeforeStop)
	}
	pending := pendingIDs(t, cl.redisAddr, stream, byStreamID)
	for _, id := range handled {
		if pending[id] {
			t.Fatalf("%s was handled before Stop and is still pending", id)
		}
	}
	acked := w.acked()
	for _, id := range ids {
		if want := slices.Contains(handled, id); (acked[id] == 1) != want {
			t.Fatalf("%s acked %d times, handled %v", id, acked[id], want)
		}
	}
}

// Stop past its deadline: only the handlers still running lose their verdicts.
// The acks already given, waiting in the coalescing window (a 30 s linger,
// AckBatch 25 of 100 in flight), still go out on the call, and the sidecar has
// applied them when Stop returns: XPENDING is exactly the stuck handler's one.
func TestStopPastItsDeadlineStillSendsTheVerdictsAlreadyGiven(t *testing.T) {
	const n, stuck = 50, 1
	cl, stream, w, conn, ids := batchSetup(t, "go:stop-deadline-flush", n)
	consumer := echomq.NewConsumer(echomq.ConsumerConfig{
		Conn: conn, Stream: stream, Group: "g", Start: echomq.StartBeginning(),
		MaxInFlight: 100, AckLinger: 30 * time.Second,
	})
	var mu sync.Mutex
	returned := 0
	stuckID := ""
	stuckEnd := make(chan error, 1)
	done := make(chan error, 1)
	go func() {
		done <- consumer.Run(context.Background(), func(ctx context.Context, d *echomq.Delivery) error {
			if string(d.Payload["n"]) == "0" {
				mu.Lock()
				stuckID = d.ID
				mu.Unlock()
				<-ctx.Done()
				stuckEnd <- context.Cause(ctx)
				return nil // gave up on the cancelled ctx: this must not ack it
			}
			mu.Lock()
			returned++
			mu.Unlock()
			return nil
		})
	}()
	if err := waitFor(20*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return returned == n-stuck && stuckID != ""
	}); err != nil {
		t.Fatalf("%d handlers returned, want %d", returned, n-stuck)
	}
	time.Sleep(1500 * time.Millisecond)
	before := pendingCount(cl.redisAddr, stream)
	if before <= stuck {
		t.Fatalf("XPENDING %d before Stop: the test needs acks waiting in the coalescing window", before)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	begin := time.Now()
	err := consumer.Stop(ctx)
	took := time.Since(begin)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Stop: %v, want DeadlineExceeded", err)
	}
	if took > 4*time.Second {
		t.Fatalf("Stop took %v with a 2 s deadline", took)
	}
	if err := <-done; err != nil {
		t.Fatalf("Run after Stop: %v", err)
	}
	if cause := <-stuckEnd; !errors.Is(cause, context.Canceled) {
		t.Fatalf("the stuck handler's context ended with %v, want Canceled", cause)
	}
	// Stop has returned: what the sidecar applied is in Redis already.
	if got := pendingCount(cl.redisAddr, stream); got != stuck {
		t.Fatalf("XPENDING %d after Stop (%d before), want %d: the acks already given were dropped", got, before, stuck)
	}
	pending := pendingIDs(t, cl.redisAddr, stream, streamIDs(t, cl.redisAddr, stream))
	acked := w.acked()
	for _, id := range ids {
		if id == stuckID {
			if !pending[id] || acked[id] != 0 {
				t.Fatalf("the stuck entry: pending %v, acked %d times; want pending, never acked", pending[id], acked[id])
			}
		} else if acked[id] != 1 {
			t.Fatalf("%s acked %d times, want once", id, acked[id])
		}
	}
}

// streamIDs maps the stream ids of stream's entries to their branded ids.
func streamIDs(t *testing.T, addr, stream string) map[string]string {
	t.Helper()
	reply, err := redisDo(addr, "XRANGE", stream, "-", "+")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, row := range reply.([]any) {
		entry := row.([]any)
		fields := entry[1].([]any)
		for i := 0; i+1 < len(fields); i += 2 {
			if fields[i].(string) == "id" {
				out[entry[0].(string)] = fields[i+1].(string)
			}
		}
	}
	return out
}

// A call broken with part of a batch acked: exactly the unacked entries come
// back, to the next consumer.
func TestDisconnectWithAPartlyAckedBatchRedeliversTheUnacked(t *testing.T) {
	const n = 10
	cl, stream, w, conn, ids := batchSetup(t, "go:partly-acked", n)
	cfg := echomq.ConsumerConfig{
		Conn: conn, Stream: stream, Group: "g", Start: echomq.StartBeginning(),
		RetryBackoffInitial: 100 * time.Millisecond, RetryBackoffMax: 100 * time.Millisecond,
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	first := echomq.NewConsumer(cfg)
	done := make(chan error, 1)
	go func() {
		done <- first.Run(ctx, func(ctx context.Context, d *echomq.Delivery) error {
			if n, _ := strconv.Atoi(string(d.Payload["n"])); n%2 == 0 {
				return nil
			}
			<-ctx.Done() // the odd ones are held when the call breaks
			return ctx.Err()
		})
	}()
	if err := waitFor(20*time.Second, func() bool { return pendingCount(cl.redisAddr, stream) == n/2 }); err != nil {
		t.Fatalf("XPENDING %d, want %d: the even entries' acks", pendingCount(cl.redisAddr, stream), n/2)
	}
	cancel() // an abrupt end: the call breaks with the odd entries held
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Run: %v", err)
	}
	acked := w.acked()
	w.mu.Lock()
	mixed := false
	for _, f := range w.frames {
		var some, notAll bool
		for _, id := range f {
			some = some || acked[id] > 0
			notAll = notAll || acked[id] == 0
		}
		mixed = mixed || (some && notAll)
	}
	w.mu.Unlock()
	if !mixed {
		t.Fatal("no frame held both acked and unacked entries: the test needs a partly acked batch")
	}

	var mu sync.Mutex
	again := map[string]uint32{}
	second := echomq.NewConsumer(cfg)
	done2 := make(chan error, 1)
	go func() {
		done2 <- second.Run(context.Background(), func(_ context.Context, d *echomq.Delivery) error {
			mu.Lock()
			again[d.ID] = d.Attempts
			mu.Unlock()
			return nil
		})
	}()
	if err := waitFor(20*time.Second, func() bool { return pendingCount(cl.redisAddr, stream) == 0 }); err != nil {
		t.Fatal("the unacked entries were not delivered again and acked")
	}
	time.Sleep(300 * time.Millisecond) // room for a wrong extra delivery
	stopRun(t, second, done2)
	mu.Lock()
	defer mu.Unlock()
	for i, id := range ids {
		attempts, redelivered := again[id]
		if redelivered != (i%2 == 1) {
			t.Fatalf("entry %d (%s): redelivered %v, want only the unacked (odd) ones; again %v", i, id, redelivered, again)
		}
		if redelivered && attempts != 2 {
			t.Fatalf("entry %d: attempts %d, want 2", i, attempts)
		}
		if acked[id] > 1 {
			t.Fatalf("entry %d acked %d times on the first call", i, acked[id])
		}
	}
}

func TestBatchHandlerSettlesEachEntryByItsVerdict(t *testing.T) {
	const n = 60
	cl, stream, w, conn, ids := batchSetup(t, "go:batch-handler", n)
	var mu sync.Mutex
	var sizes []int
	attempts := map[string][]uint32{}
	consumer := echomq.NewConsumer(echomq.ConsumerConfig{
		Conn: conn, Stream: stream, Group: "g", Start: echomq.StartBeginning(), MaxBatch: 32,
		RetryBackoffInitial: 100 * time.Millisecond, RetryBackoffMax: 100 * time.Millisecond,
	})
	done := make(chan error, 1)
	go func() {
		done <- consumer.RunBatch(context.Background(), func(_ context.Context, batch []*echomq.Delivery) []error {
			errs := make([]error, len(batch))
			mu.Lock()
			defer mu.Unlock()
			sizes = append(sizes, len(batch))
			for i, d := range batch {
				attempts[d.ID] = append(attempts[d.ID], d.Attempts)
				if k, _ := strconv.Atoi(string(d.Payload["n"])); k%3 == 0 && d.Attempts == 1 {
					errs[i] = errors.New("every third fails once")
				}
			}
			return errs
		})
	}()
	if err := waitFor(20*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(attempts) == n && pendingCount(cl.redisAddr, stream) == 0
	}); err != nil {
		t.Fatalf("%d of %d entries seen, XPENDING %d", len(attempts), n, pendingCount(cl.redisAddr, stream))
	}
	stopRun(t, consumer, done)
	mu.Lock()
	defer mu.Unlock()
	if slices.Max(sizes) < 2 || slices.Max(sizes) > 32 {
		t.Fatalf("batch sizes %v: want some above 1 and none above MaxBatch 32", sizes)
	}
	acked := w.acked()
	for i, id := range ids {
		want := []uint32{1}
		if i%3 == 0 {
			want = []uint32{1, 2}
		}
		if !slices.Equal(attempts[id], want) {
			t.Fatalf("entry %d: attempts %v, want %v", i, attempts[id], want)
		}
		if acked[id] != 1 {
			t.Fatalf("entry %d acked %d times, want once", i, acked[id])
		}
	}
	if w.ackMessages() >= n {
		t.Fatalf("%d Ack messages for %d entries: not coalesced", w.ackMessages(), n)
	}
}
