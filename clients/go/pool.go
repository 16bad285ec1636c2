package echomq

import (
	"context"
	"fmt"
	"sync"
)

// work is one queued run for a worker: a delivery, or a frame for a batch
// handler.
type work struct {
	k     *call
	d     *Delivery
	batch []*Delivery
}

// pool is the consumer's fixed set of handler workers: Concurrency goroutines
// (DefaultConcurrency by default, at most the effective max_in_flight) started on the first subscribe and
// taking work until Run ends. Shared by the consumer's calls, so a handler of
// a broken call still counts against the bound while the next call delivers.
// Nothing is started per delivery.
//
// The work waits in a queue under mu, not in a channel: a channel send to a
// parked worker wakes that worker, so a frame of 256 deliveries cost 256
// wake-ups (selectgo, park, ready: after the unmarshal, the largest cost of
// the client in BenchmarkConsume's profile) even when one worker could have
// run them all in the time it takes to wake another. Here a worker wakes
// another only while work is waiting and no other woken worker is already
// on its way to it (searching), as the Go scheduler wakes Ps: a backlog
// still spreads over every worker it needs, one wake-up at a time, and fast
// handlers are run by the workers already awake.
type pool struct {
	mu sync.Mutex
	// queue[head:] is the waiting work, in delivery order.
	queue []work
	head  int
	// limit bounds the waiting work (the call's max_in_flight, which the
	// sidecar never exceeds); a push beyond it waits until room is closed,
	// which happens when a worker takes work (only a broken call's leftovers
	// can fill it).
	limit int
	room  chan struct{}
	// idle holds the parked workers; searching counts those woken and not
	// yet holding work.
	idle      []*worker
	searching int
	stopped   bool

	quit    chan struct{}
	workers []*worker
	wg      sync.WaitGroup
	// batch: the items are frames for a BatchHandler.
	batch bool
}

// worker is one handler goroutine. mu guards what it runs, so that a lost
// lease cancels the right delivery's context.
type worker struct {
	// wake (capacity 1) is sent to when the worker is taken off idle.
	wake chan struct{}

	mu sync.Mutex
	// k is the call being handled, d its delivery (nil for a batch) or batch
	// the frame of a batch handler.
	k     *call
	d     *Delivery
	batch []*Delivery
	// ctx is the handlers' context, a child of ctxCall's handlers context, reused
	// across deliveries until that call ends or a lost lease cancels it
	// (with cause ErrLeaseLost). One context per worker and call, not per
	// delivery: a lost lease is rare, a delivery is the hot path.
	ctx     context.Context
	cancel  context.CancelCauseFunc
	ctxCall *call
}

// startPool starts the workers on first use, sized from Concurrency, else
// MaxInFlight when that is set, else DefaultConcurrency (1 for a batch
// handler), never above the call's effective max_in_flight.
func (c *Consumer) startPool(effective int) *pool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pool != nil {
		return c.pool
	}
	n := c.cfg.flow().Concurrency
	switch {
	case n <= 0 && c.batchHandler != nil:
		n = 1 // a batch handler works in bulk: one batch at a time unless asked
	case n <= 0 && c.cfg.flow().MaxInFlight == 0:
		// The adaptive window: the cap (1024) would be 1024 goroutines
		// mostly idle; see DefaultConcurrency.
		n = min(DefaultConcurrency, effective)
	case n <= 0 || n > effective:
		n = effective
	}
	n = max(n, 1)
	p := &pool{
		limit: max(effective, 1),
		quit:  make(chan struct{}),
		batch: c.batchHandler != nil,
	}
	for range n {
		w := &worker{wake: make(chan struct{}, 1)}
		p.workers = append(p.workers, w)
		p.wg.Add(1)
		go c.runWorker(p, w)
	}
	c.pool = p
	return p
}

func (c *Consumer) runWorker(p *pool, w *worker) {
	defer p.wg.Done()
	defer w.release()
	for {
		it, ok := p.next(w)
		if !ok {
			return
		}
		c.runWork(w, it)
	}
}

// push queues the work of one frame, waiting while the queue is full; false if
// done ends first.
func (p *pool) push(items []work, done <-chan struct{}) bool {
	p.mu.Lock()
	for live := len(p.queue) - p.head; live > 0 && live+len(items) > p.limit && !p.stopped; live = len(p.queue) - p.head {
		if p.room == nil {
			p.room = make(chan struct{})
		}
		room := p.room
		p.mu.Unlock()
		select {
		case <-room:
		case <-done:
			return false
		}
		p.mu.Lock()
	}
	if p.head > 0 && len(p.queue)+len(items) > cap(p.queue) {
		// Reuse the taken front rather than grow.
		n := copy(p.queue, p.queue[p.head:])
		clear(p.queue[n:])
		p.queue, p.head = p.queue[:n], 0
	}
	p.queue = append(p.queue, items...)
	p.wakeOne()
	p.mu.Unlock()
	return true
}

// next returns w's next work, waiting for it; false when the pool stops.
func (p *pool) next(w *worker) (work, bool) {
	p.mu.Lock()
	woken := false
	for {
		if p.stopped {
			p.mu.Unlock()
			return work{}, false
		}
		if woken {
			p.searching--
			woken = false
		}
		if p.head < len(p.queue) {
			it := p.queue[p.head]
			p.queue[p.head] = work{}
			p.head++
			if p.head == len(p.queue) {
				p.queue, p.head = p.queue[:0], 0
			} else {
				p.wakeOne() // more is waiting: let another worker come for it
			}
			if p.room != nil {
				close(p.room)
				p.room = nil
			}
			p.mu.Unlock()
			return it, true
		}
		p.idle = append(p.idle, w)
		p.mu.Unlock()
		select {
		case <-w.wake:
		case <-p.quit:
			return work{}, false
		}
		p.mu.Lock()
		woken = true
	}
}

// wakeOne wakes an idle worker unless one is already searching. p.mu is held.
func (p *pool) wakeOne() {
	if p.searching > 0 || len(p.idle) == 0 {
		return
	}
	w := p.idle[len(p.idle)-1]
	p.idle = p.idle[:len(p.idle)-1]
	p.searching++
	select {
	case w.wake <- struct{}{}:
	default: // cannot happen: a worker is on idle only with its wake empty
	}
}

// runWork runs one item unless its call ended or a stop began: then no
// handler runs it, and the call gives it back to the group (see
// call.giveBack; once the call ended, the sidecar has returned it already).
func (c *Consumer) runWork(w *worker, it work) {
	k := it.k
	if !k.begin() {
		if it.d != nil {
			k.giveBack([]*Delivery{it.d})
		} else {
			k.giveBack(it.batch)
		}
		return
	}
	defer k.end()
	// enter before takeLost: a LEASE_LOST that arrives in between finds the
	// worker running the delivery; one that came before is in k's lost set.
	ctx := w.enter(k, it.d, it.batch)
	defer w.leave()
	if it.d != nil {
		if k.takeLost(it.d.ID) {
			k.lose(it.d) // its lease was lost before it started: a peer has it now
			return
		}
		c.handle(ctx, it.d, c.handler)
		return
	}
	batch := it.batch
	if k.lostN.Load() > 0 {
		kept := batch[:0:0]
		for _, d := range batch {
			if k.takeLost(d.ID) {
				k.lose(d)
			} else {
				kept = append(kept, d)
			}
		}
		batch = kept
	}
	if len(batch) > 0 {
		c.handleBatch(ctx, batch, c.batchHandler)
	}
}

// enter records what w runs and returns the handler context for k.
func (w *worker) enter(k *call, d *Delivery, batch []*Delivery) context.Context {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ctx == nil || w.ctxCall != k {
		if w.cancel != nil {
			w.cancel(nil)
		}
		w.ctx, w.cancel = context.WithCancelCause(k.handlers)
		w.ctxCall = k
	}
	w.k, w.d, w.batch = k, d, batch
	return w.ctx
}

func (w *worker) leave() {
	w.mu.Lock()
	w.k, w.d, w.batch = nil, nil, nil
	w.mu.Unlock()
}

func (w *worker) release() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.cancel != nil {
		w.cancel(nil)
	}
	w.ctx, w.cancel, w.ctxCall = nil, nil, nil
}

// loseRunning handles a lost lease of delivery id of k if a worker runs it:
// no verdict will be sent for it, and a handler's context is cancelled with
// cause ErrLeaseLost (a batch handler's is not: the rest of its frame is
// still held). false if no worker runs it.
func (p *pool) loseRunning(k *call, id string) bool {
	for _, w := range p.workers {
		w.mu.Lock()
		if w.k == k {
			if w.d != nil && w.d.ID == id {
				k.lose(w.d)
				w.cancel(ErrLeaseLost)
				w.ctx = nil // the next delivery gets a fresh context
				w.mu.Unlock()
				return true
			}
			for _, d := range w.batch {
				if d.ID == id {
					k.lose(d)
					w.mu.Unlock()
					return true
				}
			}
		}
		w.mu.Unlock()
	}
	return false
}

// takeQueued takes the work of call k still waiting in the queue, which no
// worker will start then, and returns its deliveries in delivery order.
func (p *pool) takeQueued(k *call) []*Delivery {
	p.mu.Lock()
	defer p.mu.Unlock()
	var taken []*Delivery
	live := p.queue[p.head:]
	kept := 0
	for _, it := range live {
		switch {
		case it.k != k:
			live[kept] = it
			kept++
		case it.d != nil:
			taken = append(taken, it.d)
		default:
			taken = append(taken, it.batch...)
		}
	}
	clear(live[kept:])
	p.queue = p.queue[:p.head+kept]
	if p.head == len(p.queue) {
		p.queue, p.head = p.queue[:0], 0
	}
	if p.room != nil && len(taken) > 0 {
		close(p.room)
		p.room = nil
	}
	return taken
}

// stop ends the workers once Run is over (no call is left to feed them).
func (p *pool) stop() {
	p.mu.Lock()
	p.stopped = true
	if p.room != nil {
		close(p.room)
		p.room = nil
	}
	p.mu.Unlock()
	close(p.quit)
}

// handle runs h on d and settles d by h's result unless h settled it.
func (c *Consumer) handle(ctx context.Context, d *Delivery, h Handler) {
	err := runHandler(ctx, h, d)
	if d.Settled() {
		return
	}
	c.settle(d, err)
}

// handleBatch runs h on batch and settles each delivery h did not settle by
// its verdict.
func (c *Consumer) handleBatch(ctx context.Context, batch []*Delivery, h BatchHandler) {
	errs, err := runBatchHandler(ctx, h, batch)
	if err == nil && errs != nil && len(errs) != len(batch) {
		err = fmt.Errorf("batch handler returned %d verdicts for %d deliveries", len(errs), len(batch))
	}
	for i, d := range batch {
		if d.Settled() {
			continue
		}
		switch {
		case err != nil:
			c.settle(d, err)
		case errs == nil:
			c.settle(d, nil)
		default:
			c.settle(d, errs[i])
		}
	}
}

// settle acks d (err nil) or fails it with err as the reason, of the kind
// err's type says ([Transient], [Poison]).
func (c *Consumer) settle(d *Delivery, err error) {
	var sendErr error
	if err == nil {
		sendErr = d.Ack()
	} else {
		sendErr = d.Fail(err.Error(), 0, kindOf(err))
	}
	if sendErr != nil {
		c.log.Debug("echomq: verdict dropped", "id", d.ID, "error", sendErr)
	}
}

func runHandler(ctx context.Context, h Handler, d *Delivery) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("handler panicked: %v", r)
		}
	}()
	return h(ctx, d)
}

func runBatchHandler(ctx context.Context, h BatchHandler, batch []*Delivery) (errs []error, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("batch handler panicked: %v", r)
		}
	}()
	return h(ctx, batch), nil
}
