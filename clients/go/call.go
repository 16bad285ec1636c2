package echomq

import (
	"context"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"time"

	pb "github.com/echomq/echomq-sidecar/clients/go/echomqv1"
)

// closeMarker, queued after the last verdict of a graceful stop, makes the
// sender flush the coalesced acks and half-close the call.
var closeMarker = &pb.ConsumeRequest{}

// outgoing is one verdict queued for the sender: an ack of one id (req nil),
// or a message to send as it is, after the acks queued before it.
type outgoing struct {
	ack string
	req *pb.ConsumeRequest
}

// drainingBit, set in call.running, refuses new handler runs.
const drainingBit = int64(1) << 62

// call is one subscribed Consume call. Two goroutines serve it, and the
// consumer's pool of handler workers (see pool.go) runs its deliveries:
//
//   - receive: reads frames; queues their deliveries on the pool's work
//     channel (one item per delivery, or per frame for a batch handler);
//     reports verdict errors;
//   - sendLoop: the only writer of the stream (gRPC allows one): sends the
//     queued verdicts in order, coalescing acks into one Ack message per short
//     window (ackLinger) or size (ackBatch).
//
// Deliveries keep a pointer to their call, so a verdict can only ever travel
// on the call that holds the delivery; once the call ends, send refuses and
// the sender's coalesced acks are dropped with it. A graceful stop, also one
// past its deadline, half-closes the call instead: the sender sends every
// verdict queued or waiting in its window before the half-close.
type call struct {
	c      *Consumer
	stream pb.ConsumerService_ConsumeClient
	// ctx ends with the call (it is the gRPC call's context).
	ctx    context.Context
	cancel context.CancelFunc
	// handlers is ctx's child that handlers of the call's deliveries get a
	// child of: a Stop past its deadline cancels it alone, so the call lives
	// on to carry the verdicts given before.
	handlers       context.Context
	cancelHandlers context.CancelCauseFunc
	pool           *pool

	// out holds verdicts for sendLoop, in order.
	out        outbox
	sendClosed atomic.Bool
	// held counts deliveries received and not yet settled on the wire (acks
	// sent, fails sent); the sender flushes at once when every one of them
	// has an ack waiting, since no more can come until new deliveries do.
	held atomic.Int64
	// ackLinger and ackBatch bound the coalescing window (ackLinger ≤ 0:
	// send as soon as the sender is free).
	ackLinger time.Duration
	ackBatch  int

	// running counts this call's handler runs in progress, with drainingBit
	// set once a graceful stop refuses new ones; idle is closed when it is
	// draining with none running.
	running  atomic.Int64
	idle     chan struct{}
	idleOnce sync.Once

	// lost holds ids whose lease the sidecar reported lost before a worker
	// started them (rare: only touched on CodeLeaseLost); lostN is its size.
	lostMu sync.Mutex
	lost   map[string]struct{}
	lostN  atomic.Int32

	// emits holds the AckEmits sent and not yet answered, by id.
	emitMu sync.Mutex
	emits  map[string]chan emitAnswer

	recvDone chan struct{}
	recvErr  error // set before recvDone is closed

	// releaseMu guards drained and unstarted: deliveries a stop kept from a
	// handler wait in unstarted until the Drain is queued, so that a Release
	// never goes out before it (the sidecar would hand a released entry
	// straight back to this call, the one with room).
	releaseMu sync.Mutex
	drained   bool
	unstarted []*Delivery

	// frame is receive's scratch for the work items of one frame.
	frame []work
	// codec is the call's codec, told when a frame's decoded deliveries
	// were copied out (recycle); nil in unit tests.
	codec *consumeCodec
}

// outbox is the sender's queue. A verdict is appended under mu, and the
// sender is woken only when it has something to do at once: a message other
// than an ack, the first ack of a coalescing window (to start its linger),
// or an ack that fills the window. The other acks of a window wait for the
// sender without waking it: a channel send per ack cost a wake-up of the
// sender per delivery (selectgo, park, ready: the largest cost in the
// profile after the unmarshal).
type outbox struct {
	mu    sync.Mutex
	items []outgoing
	// acks counts the acks given and not yet sent: in items, or in the
	// sender's window.
	acks int
	// closed: the half-close is queued; nothing may follow it (a verdict
	// either goes out before it or is refused).
	closed bool
	// limit bounds items (one verdict per delivery the call may hold, plus
	// room for raw verdicts and extensions); an enqueue beyond it waits
	// until room is closed, which the sender does when it takes the items.
	limit int
	room  chan struct{}
	// wake (capacity 1) wakes the sender.
	wake chan struct{}
}

func newCall(c *Consumer, stream pb.ConsumerService_ConsumeClient, ctx context.Context, cancel context.CancelFunc, maxInFlight int) *call {
	linger := c.cfg.AckLinger
	if linger == 0 {
		linger = DefaultAckLinger
	}
	batch := c.cfg.AckBatch
	if batch <= 0 {
		batch = DefaultAckBatch
	}
	// A quarter of the credit is what makes the sidecar read again: waiting
	// for more acks than that only stalls the flow.
	batch = max(1, min(batch, maxInFlight/4))
	handlers, cancelHandlers := context.WithCancelCause(ctx)
	return &call{
		c:              c,
		stream:         stream,
		ctx:            ctx,
		cancel:         cancel,
		handlers:       handlers,
		cancelHandlers: cancelHandlers,
		pool:           c.startPool(maxInFlight),
		out:            outbox{limit: maxInFlight + 16, wake: make(chan struct{}, 1)},
		ackLinger:      linger,
		ackBatch:       batch,
		idle:           make(chan struct{}),
		recvDone:       make(chan struct{}),
	}
}

// serve runs the call until it ends. It returns nil when a graceful stop
// closed it, otherwise why it ended.
func (k *call) serve() error {
	go k.receive()
	go k.sendLoop()
	select {
	case <-k.recvDone:
		k.cancel()
		return k.endError()
	case <-k.c.stopping:
		return k.drain()
	}
}

// drain is the graceful end: a Drain tells the sidecar to hand this call
// nothing more (so the credit freed by the last acks pulls no new entry into
// the PEL); no new handler starts; a Release gives back the deliveries no
// handler started (queued for the workers, or still arriving), so the
// group's other consumers get them at once with the attempts they had; the
// running ones finish and queue their verdicts; the sender flushes the
// coalesced acks and half-closes after them; the sidecar, having applied
// them, ends the call.
//
// Stop's deadline does not wait for the running handlers: their verdicts are
// refused from then on and their contexts cancelled (in that order, so one
// that gives up and returns nil acks nothing), and the half-close follows the
// verdicts already given at once. Stop bounds the wait for the sidecar's end
// of the call (stopCloseGrace), then drops it. The call breaking cuts it
// short.
func (k *call) drain() error {
	defer k.cancel()
	drainReq := &pb.ConsumeRequest{Kind: &pb.ConsumeRequest_Drain{Drain: &pb.Drain{}}}
	_ = k.push(outgoing{req: drainReq}, k.recvDone)
	if k.running.Or(drainingBit) == 0 {
		k.setIdle()
	}
	k.releaseMu.Lock()
	k.drained = true
	unstarted := append(k.unstarted, k.pool.takeQueued(k)...)
	k.unstarted = nil
	k.releaseMu.Unlock()
	k.release(unstarted)
	select {
	case <-k.idle:
	case <-k.c.expired:
		k.sendClosed.Store(true)
		k.cancelHandlers(nil)
	case <-k.recvDone:
		return nil
	case <-k.ctx.Done():
		return nil
	}
	k.sendClosed.Store(true)
	if k.push(outgoing{req: closeMarker}, k.recvDone) != nil {
		return nil
	}
	select {
	case <-k.recvDone:
		if errors.Is(k.recvErr, io.EOF) {
			k.c.closedClean.Store(true) // the sidecar applied what was sent
		}
	case <-k.ctx.Done():
	}
	return nil
}

func (k *call) setIdle() { k.idleOnce.Do(func() { close(k.idle) }) }

// giveBack releases ds, which a stop kept from a handler: at once once the
// Drain is queued, else when drain queues it.
func (k *call) giveBack(ds []*Delivery) {
	k.releaseMu.Lock()
	if !k.drained {
		k.unstarted = append(k.unstarted, ds...)
		k.releaseMu.Unlock()
		return
	}
	k.releaseMu.Unlock()
	k.release(ds)
}

// release sends one Release of ds, deliveries no handler started: the
// sidecar gives them back to the group at once with their delivery count
// restored, for another consumer (this sidecar's other calls, or a peer's
// next reclaim beat), so they cost no attempt and no wait for the reclaim's
// min-idle. Each counts as settled here. Nothing is sent for one already
// settled or whose lease was lost, nor at most once (NoAck: nothing is
// pending), nor once the call ended (the sidecar returned them already).
func (k *call) release(ds []*Delivery) {
	if len(ds) == 0 || k.c.cfg.NoAck || k.ctx.Err() != nil {
		return
	}
	ids := make([]string, 0, len(ds))
	for _, d := range ds {
		if k.takeLost(d.ID) {
			k.lose(d)
			continue
		}
		if d.settled.CompareAndSwap(int32(unsettled), int32(released)) {
			ids = append(ids, d.ID)
		}
	}
	if len(ids) == 0 {
		return
	}
	req := &pb.ConsumeRequest{Kind: &pb.ConsumeRequest_Release{Release: &pb.Release{Ids: ids}}}
	if k.push(outgoing{req: req}, k.recvDone) == nil {
		k.c.log.Info("echomq: stop: released deliveries no handler started back to the group", "count", len(ids))
	}
}

// begin admits one handler run, unless the call ended or a stop began: a stop
// wins over a delivery that is ready at the same moment. end must follow a
// true begin.
func (k *call) begin() bool {
	if k.ctx.Err() != nil || k.c.isStopping() {
		return false
	}
	if k.running.Add(1)&drainingBit != 0 {
		k.end()
		return false
	}
	return true
}

func (k *call) end() {
	if k.running.Add(-1) == drainingBit {
		k.setIdle()
	}
}

func (k *call) endError() error {
	if errors.Is(k.recvErr, io.EOF) {
		return errors.New("echomq: the sidecar ended the consume call")
	}
	return k.c.callError(k.recvErr)
}

func (k *call) receive() {
	defer close(k.recvDone)
	for {
		m, err := k.stream.Recv()
		if err != nil {
			k.recvErr = err
			return
		}
		switch kind := m.GetKind().(type) {
		case *pb.ConsumeResponse_Delivery:
			frame := []*pb.Delivery{kind.Delivery}
			if !k.deliver(frame) {
				return
			}
			k.codec.recycle(frame)
		case *pb.ConsumeResponse_Batch:
			frame := kind.Batch.GetDeliveries()
			if !k.deliver(frame) {
				return
			}
			k.codec.recycle(frame)
		case *pb.ConsumeResponse_VerdictError:
			v := kind.VerdictError
			e := VerdictError{ID: v.GetId(), Code: v.GetCode(), Message: v.GetMessage()}
			// An AckEmit's refusal goes to its caller and to the hook.
			k.answerEmit(e.ID, emitAnswer{refused: &e})
			if v.GetCode() == CodeLeaseLost {
				k.leaseLost(v.GetId())
			}
			k.c.verdictError(e)
		case *pb.ConsumeResponse_Emitted:
			k.answerEmit(kind.Emitted.GetId(), emitAnswer{emitted: kind.Emitted})
		default:
			// A repeated Subscribed or a kind newer than this client: nothing to do.
		}
	}
}

// deliver queues the deliveries of one frame for the workers: one item per
// delivery, or the whole frame for a batch handler, in one push. The pool's
// queue holds the call's max_in_flight, which the sidecar never exceeds, so
// this blocks only while a broken call's leftovers are skipped. false: the
// call ended.
func (k *call) deliver(frame []*pb.Delivery) bool {
	if len(frame) == 0 {
		return true
	}
	slab := make([]Delivery, len(frame))
	k.held.Add(int64(len(frame)))
	if k.pool.batch {
		batch := make([]*Delivery, len(frame))
		for i, m := range frame {
			slab[i].fill(k, m)
			batch[i] = &slab[i]
		}
		return k.queue(append(k.frame[:0], work{k: k, batch: batch}))
	}
	items := k.frame[:0]
	for i, m := range frame {
		slab[i].fill(k, m)
		items = append(items, work{k: k, d: &slab[i]})
	}
	k.frame = items
	return k.queue(items)
}

func (k *call) queue(items []work) bool {
	ok := k.pool.push(items, k.ctx.Done())
	clear(items) // the queue has its own copy; drop the pointers
	if !ok {
		k.recvErr = k.ctx.Err()
	}
	return ok
}

// leaseLost handles an unprompted LEASE_LOST for id: if a worker runs the
// delivery, its handler context is cancelled (cause ErrLeaseLost) and no
// verdict will be sent for it; if it is still queued, no worker starts it.
// (An id already settled — its ack waiting in the coalescing window — keeps
// its verdict; its entry in lost is dropped when the call ends.)
func (k *call) leaseLost(id string) {
	k.lostMu.Lock()
	if k.lost == nil {
		k.lost = map[string]struct{}{}
	}
	k.lost[id] = struct{}{}
	k.lostN.Store(int32(len(k.lost)))
	k.lostMu.Unlock()
	if k.pool.loseRunning(k, id) {
		k.forgetLost(id)
	}
}

// lose marks d's lease lost unless a verdict came first; the call then no
// longer holds it (the sidecar freed its slot), so it leaves held.
func (k *call) lose(d *Delivery) {
	if d.lose() {
		k.held.Add(-1)
	}
}

// takeLost reports whether id's lease was lost, forgetting it.
func (k *call) takeLost(id string) bool {
	if k.lostN.Load() == 0 {
		return false
	}
	return k.forgetLost(id)
}

func (k *call) forgetLost(id string) bool {
	k.lostMu.Lock()
	defer k.lostMu.Unlock()
	_, ok := k.lost[id]
	delete(k.lost, id)
	k.lostN.Store(int32(len(k.lost)))
	return ok
}

// send queues a verdict for this call, or refuses once the call has ended or
// half-closed.
func (k *call) send(req *pb.ConsumeRequest) error {
	return k.enqueue(outgoing{req: req})
}

// ack queues the acknowledgement of id, coalesced by the sender.
func (k *call) ack(id string) error {
	return k.enqueue(outgoing{ack: id})
}

func (k *call) enqueue(o outgoing) error {
	if k.sendClosed.Load() || k.ctx.Err() != nil {
		return ErrCallEnded
	}
	return k.push(o, nil)
}

// push queues o for the sender (waiting while the queue is full) and wakes
// the sender if o needs it now; ErrCallEnded if the call or giveUp ends
// first.
func (k *call) push(o outgoing, giveUp <-chan struct{}) error {
	q := &k.out
	q.mu.Lock()
	for {
		if q.closed {
			q.mu.Unlock()
			return ErrCallEnded
		}
		if len(q.items) < q.limit {
			break
		}
		if q.room == nil {
			q.room = make(chan struct{})
		}
		room := q.room
		q.mu.Unlock()
		select {
		case <-room:
		case <-k.ctx.Done():
			return ErrCallEnded
		case <-giveUp:
			return ErrCallEnded
		}
		q.mu.Lock()
	}
	q.items = append(q.items, o)
	q.closed = o.req == closeMarker
	wake := true
	if o.req == nil {
		q.acks++
		wake = q.acks == 1 || q.acks >= k.ackBatch || int64(q.acks) >= k.held.Load() || k.ackLinger < 0
	}
	q.mu.Unlock()
	if wake {
		select {
		case q.wake <- struct{}{}:
		default: // already woken
		}
	}
	return nil
}

// take swaps the queued items for into (emptied), which it returns for reuse.
func (q *outbox) take(into []outgoing) []outgoing {
	q.mu.Lock()
	defer q.mu.Unlock()
	taken := q.items
	q.items = into[:0]
	if q.room != nil {
		close(q.room)
		q.room = nil
	}
	return taken
}

// sent forgets n acks that went out.
func (q *outbox) sent(n int) {
	q.mu.Lock()
	q.acks -= n
	q.mu.Unlock()
}

// sendLoop sends the queued verdicts in order. Acks wait in ids until one of:
// ackBatch of them, ackLinger since the first, every delivery the call holds
// has one, or another message (a Fail, an Extend, a raw verdict, the
// half-close) is to go out after them; only a Drain overtakes them. When the call ends the waiting acks end with it:
// they are never sent on another call.
func (k *call) sendLoop() {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	var ids []string
	flush := func() bool {
		if len(ids) == 0 {
			return true
		}
		timer.Stop()
		req := &pb.ConsumeRequest{Kind: &pb.ConsumeRequest_Ack{Ack: &pb.Ack{Ids: ids}}}
		k.held.Add(-int64(len(ids)))
		k.out.sent(len(ids))
		ids = make([]string, 0, k.ackBatch)
		// An error means the call is over; receive reports why.
		return k.stream.Send(req) == nil
	}
	var batch []outgoing
	for {
		if k.ctx.Err() != nil {
			return
		}
		batch = k.out.take(batch)
		if len(batch) == 0 {
			var lingered <-chan time.Time
			if len(ids) > 0 {
				lingered = timer.C
			}
			select {
			case <-k.out.wake:
			case <-lingered:
				if !flush() {
					return
				}
			case <-k.ctx.Done():
				return
			}
			continue
		}
		for i, o := range batch {
			batch[i] = outgoing{} // the next take reuses batch
			if o.req == nil {
				if len(ids) == 0 && k.ackLinger > 0 {
					timer.Reset(k.ackLinger)
				}
				ids = append(ids, o.ack)
				full := len(ids) >= k.ackBatch || int64(len(ids)) >= k.held.Load() ||
					(k.ackLinger < 0 && i == len(batch)-1)
				if full && !flush() {
					return
				}
				continue
			}
			// The Drain goes ahead of the waiting acks, so the credit they
			// free pulls no new entry; every other message goes after them.
			if o.req.GetDrain() == nil && !flush() {
				return
			}
			if o.req == closeMarker {
				_ = k.stream.CloseSend()
				return
			}
			if o.req.GetFail() != nil || o.req.GetAckEmit() != nil {
				k.held.Add(-1)
			}
			if r := o.req.GetRelease(); r != nil {
				k.held.Add(-int64(len(r.GetIds())))
			}
			if err := k.stream.Send(o.req); err != nil {
				return
			}
		}
	}
}
