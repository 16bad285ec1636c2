package echomq

import (
	"context"
	"errors"
	"io"
	"sync"
	"sync/atomic"

	pb "github.com/echomq/echomq-sidecar/clients/go/echomqv1"
)

// maxAckBatch bounds how many queued acks the sender folds into one Ack message.
const maxAckBatch = 512

// closeMarker, queued after the last verdict of a graceful stop, makes the
// sender half-close the call.
var closeMarker = &pb.ConsumeRequest{}

// call is one subscribed Consume call. Three goroutines serve it:
//
//   - receive: reads frames; queues deliveries, reports verdict errors;
//   - dispatch: starts a handler per queued delivery while a slot is free and
//     the consumer is not stopping;
//   - sendLoop: the only writer of the stream (gRPC allows one): sends the
//     queued verdicts, folding consecutive acks into one message.
//
// Deliveries keep a pointer to their call, so a verdict can only ever travel
// on the call that holds the delivery; once the call ends, send refuses.
type call struct {
	c      *Consumer
	stream pb.ConsumerService_ConsumeClient
	// ctx ends with the call; handlers of its deliveries get it.
	ctx    context.Context
	cancel context.CancelFunc
	slots  chan struct{}

	// queue holds received deliveries not yet started. Its capacity is the
	// effective max_in_flight, which the sidecar never exceeds, so receive
	// does not block on it.
	queue chan *Delivery
	// sendq holds verdicts for sendLoop; sized like queue plus room for
	// raw verdicts.
	sendq      chan *pb.ConsumeRequest
	sendClosed atomic.Bool

	// leases maps the branded id of each delivery received and not yet
	// finished to it, so a LEASE_LOST can cancel its context.
	leasesMu sync.Mutex
	leases   map[string]*Delivery

	recvDone     chan struct{}
	recvErr      error // set before recvDone is closed
	dispatchDone chan struct{}
	// handlers counts this call's running handlers.
	handlers sync.WaitGroup
}

func newCall(c *Consumer, stream pb.ConsumerService_ConsumeClient, ctx context.Context, cancel context.CancelFunc, maxInFlight int) *call {
	return &call{
		c:            c,
		stream:       stream,
		ctx:          ctx,
		cancel:       cancel,
		slots:        c.handlerSlots(maxInFlight),
		queue:        make(chan *Delivery, maxInFlight),
		sendq:        make(chan *pb.ConsumeRequest, maxInFlight+16),
		leases:       make(map[string]*Delivery),
		recvDone:     make(chan struct{}),
		dispatchDone: make(chan struct{}),
	}
}

// serve runs the call until it ends. It returns nil when a graceful stop
// closed it, otherwise why it ended.
func (k *call) serve(h Handler) error {
	go k.receive()
	go k.sendLoop()
	go k.dispatch(h)
	select {
	case <-k.recvDone:
		k.cancel()
		<-k.dispatchDone
		return k.endError()
	case <-k.c.stopping:
		return k.drain()
	}
}

// drain is the graceful end: a Drain tells the sidecar to hand this call
// nothing more (so the credit freed by the last acks pulls no new entry into
// the PEL); no new handler starts; the running ones finish and queue their
// verdicts; the sender half-closes after them; the sidecar, having applied
// them, ends the call. Deliveries already on the wire are left un-settled:
// the call's end returns them to the group. The call breaking or Stop's
// deadline cuts it short.
func (k *call) drain() error {
	defer k.cancel()
	drainReq := &pb.ConsumeRequest{Kind: &pb.ConsumeRequest_Drain{Drain: &pb.Drain{}}}
	select {
	case k.sendq <- drainReq:
	case <-k.recvDone:
	case <-k.ctx.Done():
	}
	<-k.dispatchDone
	idle := make(chan struct{})
	go func() {
		k.handlers.Wait()
		close(idle)
	}()
	select {
	case <-idle:
	case <-k.recvDone:
		return nil
	case <-k.ctx.Done():
		return nil
	}
	k.sendClosed.Store(true)
	select {
	case k.sendq <- closeMarker:
	case <-k.recvDone:
		return nil
	case <-k.ctx.Done():
		return nil
	}
	select {
	case <-k.recvDone:
	case <-k.ctx.Done():
	}
	return nil
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
			d := newDelivery(k, kind.Delivery)
			d.ctx, d.cancel = context.WithCancel(k.ctx)
			k.leasesMu.Lock()
			k.leases[d.ID] = d
			k.leasesMu.Unlock()
			select {
			case k.queue <- d:
			case <-k.ctx.Done():
				k.recvErr = k.ctx.Err()
				return
			}
		case *pb.ConsumeResponse_VerdictError:
			v := kind.VerdictError
			if v.GetCode() == CodeLeaseLost {
				k.leaseLost(v.GetId())
			}
			k.c.verdictError(VerdictError{ID: v.GetId(), Code: v.GetCode(), Message: v.GetMessage()})
		default:
			// A repeated Subscribed or a kind newer than this client: nothing to do.
		}
	}
}

func (k *call) dispatch(h Handler) {
	defer close(k.dispatchDone)
	for {
		// A stop wins over a delivery that is ready at the same moment.
		if k.c.isStopping() || k.ctx.Err() != nil {
			return
		}
		var d *Delivery
		select {
		case d = <-k.queue:
		case <-k.c.stopping:
			return
		case <-k.ctx.Done():
			return
		}
		select {
		case k.slots <- struct{}{}:
		case <-k.c.stopping:
			return
		case <-k.ctx.Done():
			return
		}
		if k.c.isStopping() {
			<-k.slots
			return
		}
		if d.ctx.Err() != nil {
			// Its lease was lost before it started: a peer has it now.
			<-k.slots
			k.finished(d)
			continue
		}
		k.handlers.Add(1)
		k.c.handlers.Add(1)
		go func() {
			defer func() {
				k.finished(d)
				<-k.slots
				k.handlers.Done()
				k.c.handlers.Done()
			}()
			k.c.handle(d.ctx, d, h)
		}()
	}
}

// leaseLost cancels the context of the delivery id, if this call still has it.
func (k *call) leaseLost(id string) {
	k.leasesMu.Lock()
	d := k.leases[id]
	k.leasesMu.Unlock()
	if d != nil {
		d.cancel()
	}
}

// finished forgets a delivery whose handler is done (or will not run).
func (k *call) finished(d *Delivery) {
	k.leasesMu.Lock()
	if k.leases[d.ID] == d {
		delete(k.leases, d.ID)
	}
	k.leasesMu.Unlock()
	if d.cancel != nil {
		d.cancel()
	}
}

// send queues a verdict for this call, or refuses once the call has ended or
// half-closed.
func (k *call) send(req *pb.ConsumeRequest) error {
	if k.sendClosed.Load() || k.ctx.Err() != nil {
		return ErrCallEnded
	}
	select {
	case k.sendq <- req:
		return nil
	case <-k.ctx.Done():
		return ErrCallEnded
	}
}

func (k *call) sendLoop() {
	var next *pb.ConsumeRequest
	for {
		req := next
		next = nil
		if req == nil {
			select {
			case req = <-k.sendq:
			case <-k.ctx.Done():
				return
			}
		}
		if req == closeMarker {
			_ = k.stream.CloseSend()
			return
		}
		if ack := req.GetAck(); ack != nil {
			ids := append([]string(nil), ack.GetIds()...)
		fold:
			for len(ids) < maxAckBatch {
				select {
				case more := <-k.sendq:
					if a := more.GetAck(); a != nil {
						ids = append(ids, a.GetIds()...)
						continue
					}
					next = more
					break fold
				default:
					break fold
				}
			}
			req = &pb.ConsumeRequest{Kind: &pb.ConsumeRequest_Ack{Ack: &pb.Ack{Ids: ids}}}
		}
		if err := k.stream.Send(req); err != nil {
			// The call is over; receive reports why.
			return
		}
	}
}
