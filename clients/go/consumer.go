package echomq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/echomq/echomq-sidecar/clients/go/echomqv1"
)

// DefaultMaxInFlight mirrors the sidecar's `--default-max-in-flight` (1024):
// the cap of the adaptive window that a call gets when
// [FlowControl.MaxInFlight] is 0, which the sidecar reports in Subscribed.
// The window starts at 64 and grows toward the cap while the handlers keep
// up. Used only when a sidecar reports no value of its own. Until the
// adaptive window (issue 27) it was 64 and also the default handler
// concurrency; that is [DefaultConcurrency] now.
const DefaultMaxInFlight = 1024

// DefaultConcurrency is the number of handler goroutines when
// [FlowControl.Concurrency] and [FlowControl.MaxInFlight] are both 0 (never
// more than the cap the sidecar reports). Not the cap itself: a fast
// handler keeps up with the whole window from 64 goroutines (the deliveries
// wait in the consumer's queue for microseconds), and when handlers are
// slow the deliveries queue in the consumer, which the sidecar sees as delay
// and answers by shrinking the window.
const DefaultConcurrency = 64

// DefaultMaxBatch is the most deliveries per frame the consumer asks for when
// [FlowControl.MaxBatch] is 0 (capped by MaxInFlight when that is set).
const DefaultMaxBatch = 256

// DefaultAckLinger is how long an ack may wait for others to share its Ack
// message when [ConsumerConfig.AckLinger] is 0.
const DefaultAckLinger = time.Millisecond

// DefaultAckBatch is the most ids of one Ack message when
// [ConsumerConfig.AckBatch] is 0.
const DefaultAckBatch = 256

// stopCloseGrace bounds how long [Consumer.Stop] still waits, once its
// context has ended, for the call to carry the verdicts already given and for
// the sidecar to end it (it ends a call only after applying its verdicts). A
// healthy sidecar needs milliseconds; the bound is for a broken call.
const stopCloseGrace = time.Second

// FlowControl bounds how much a consumer takes on at once (clients/CONTRACT.md,
// "Surface"). There is no byte bound: the protocol counts entries.
type FlowControl struct {
	// MaxInFlight is the most deliveries the call holds un-settled (running
	// or queued for a handler), fixed. 0 (sent as 0): an adaptive window of
	// 64 up to the sidecar's cap (`--default-max-in-flight`, 1024 by default,
	// [DefaultMaxInFlight]), which grows while the handlers keep up and
	// shrinks (down to 8) when deliveries queue in the consumer. Either way
	// the consumer buffers at most the cap the sidecar reports: at most
	// cap × entry size bytes (1024 × `--max-message-bytes`). Above the
	// sidecar's limit (10000 by default) the subscription fails with
	// INVALID_ARGUMENT.
	MaxInFlight uint32
	// Concurrency is the most handlers running at once: the consumer starts
	// this many handler goroutines once and feeds them every delivery (or,
	// with [Consumer.RunBatch], every frame). 0: MaxInFlight when that is
	// set; [DefaultConcurrency] (64) when it is not; 1 with RunBatch. More
	// than the effective MaxInFlight (the one the sidecar reports) is never
	// used.
	Concurrency int
	// MaxBatch is the most deliveries the sidecar may put in one frame
	// (Subscribe.max_batch). Frames never wait to fill, so batching adds no
	// latency at low rates; at high rates it saves a gRPC message per entry.
	// A [Handler] still sees one delivery at a time; a [BatchHandler] sees one
	// frame. 0: [DefaultMaxBatch] (256), or MaxInFlight if that is set and
	// smaller. With MaxInFlight unset it is 256, a quarter of the default cap
	// (1024): a frame never holds more than the window's free credit (64 at
	// the start), and the sidecar reads again when a quarter is free, so a
	// full window comes in four frames. 1: one delivery per frame.
	// Above 4096 the subscription fails with INVALID_ARGUMENT.
	MaxBatch uint32
}

// flow is the FlowControl in effect: each field of cfg.FlowControl, or where
// that is 0 the deprecated flat field of the same name.
func (cfg *ConsumerConfig) flow() FlowControl {
	f := cfg.FlowControl
	if f.MaxInFlight == 0 {
		f.MaxInFlight = cfg.MaxInFlight
	}
	if f.Concurrency == 0 {
		f.Concurrency = cfg.Concurrency
	}
	if f.MaxBatch == 0 {
		f.MaxBatch = cfg.MaxBatch
	}
	return f
}

// ConsumerConfig is a subscription and how to run its handler. Stream, Group,
// Start and one of Target or Conn are required; every other field has a
// default.
type ConsumerConfig struct {
	// Target is the sidecar's address, `host:port` or `unix:/path` (as its
	// `--listen`, ECHOMQ_LISTEN). The consumer dials it with [Dial] and closes
	// the connection when Run returns. Ignored when Conn is set.
	Target string
	// Conn is a connection to share (from [Dial], or a grpc.ClientConn of your
	// own, e.g. with TLS). The consumer does not close it.
	Conn grpc.ClientConnInterface

	// Stream is the stream key. Required.
	Stream string
	// Group is the consumer group. Required.
	Group string
	// Start is where the group begins if the subscription creates it.
	// Required: the zero Start is refused.
	Start Start

	// FlowControl is how much the consumer takes on at once: MaxInFlight,
	// Concurrency and MaxBatch, grouped as cloud.google.com/go/pubsub groups
	// them in its ReceiveSettings. The zero value takes every default.
	FlowControl FlowControl

	// MaxInFlight is FlowControl.MaxInFlight, used when that is 0.
	//
	// Deprecated: set [FlowControl].MaxInFlight; this field goes away in the
	// next release.
	MaxInFlight uint32
	// Concurrency is FlowControl.Concurrency, used when that is 0.
	//
	// Deprecated: set [FlowControl].Concurrency; this field goes away in the
	// next release.
	Concurrency int
	// MaxBatch is FlowControl.MaxBatch, used when that is 0.
	//
	// Deprecated: set [FlowControl].MaxBatch; this field goes away in the
	// next release.
	MaxBatch uint32

	// AckLinger is how long an ack waits for others to travel in the same
	// Ack message. An ack goes out at the latest this long after it was
	// given, sooner when AckBatch acks are waiting, when every delivery the
	// call holds has its ack waiting, or when a Fail, an Extend or a graceful
	// Stop's end is sent (in order, after the acks before it; also when the
	// Stop's deadline passed: see [Consumer.Stop]). Fails are
	// never delayed. 0: [DefaultAckLinger] (1 ms). Negative: no linger: acks
	// go out as soon as the sender is free, folding only those already queued.
	AckLinger time.Duration
	// AckBatch is the most ids in one Ack message. 0: [DefaultAckBatch]
	// (256). Never more than a quarter of the effective MaxInFlight (at
	// least 1): the sidecar reads again when that much credit is free.
	AckBatch int

	// AckDeadline is how long a delivery may stay un-settled before the
	// sidecar treats it as failed. 0: no deadline while the call lives.
	AckDeadline time.Duration
	// RetryBackoffInitial is the first redelivery delay after a Fail without
	// a delay (or a dropped call), doubled per attempt. 0: the sidecar's
	// default (`--retry-backoff-initial-ms`, 1 s).
	RetryBackoffInitial time.Duration
	// RetryBackoffMax caps that delay. 0: the sidecar's default
	// (`--retry-backoff-max-ms`, 60 s). An initial delay above the cap (either
	// one given here or the sidecar's default) is refused: Run returns a
	// [*SubscriptionError] with INVALID_ARGUMENT.
	RetryBackoffMax time.Duration
	// DeadLetterStream is where [Delivery.DeadLetter] and poison entries go.
	// "": `<stream>:dlq`. A group setting: every consumer of the group on one
	// sidecar must name the same (FAILED_PRECONDITION otherwise).
	DeadLetterStream string
	// MaxDeliveries makes poison entries dead letters: an entry delivered this
	// many times is moved to the dead-letter stream instead of being handed
	// out again. 0: the sidecar's default (`--default-max-deliveries`, itself
	// 0: no limit). A group setting, like DeadLetterStream.
	MaxDeliveries uint32
	// NoAck is the at-most-once mode (XREADGROUP … NOACK): entries are never
	// pending, so an entry whose handler fails, panics or never returns is
	// LOST — no retry, no reclaim, no dead letter, and Fail is refused with a
	// verdict error. Off by default; turn it on only where losing entries is
	// acceptable.
	NoAck bool

	// KeyField turns on per-key limits (ordering by key): it names the payload
	// field whose value is an entry's key (an order's "customer", an account).
	// At most MaxInFlightPerKey entries of one key are then held at once
	// anywhere in the group, across every sidecar, and a key's entries start
	// in stream order: a failed entry is retried before its key's later ones,
	// and an ack or a dead letter frees the key. Entries without the field
	// are not limited; other keys never wait behind a busy one. "": no
	// per-key limit. A group setting, like DeadLetterStream: every consumer
	// of the group should name the same field and limit. The sidecar checks
	// both and refuses a bad combination at subscribe, and Run returns a
	// [*SubscriptionError] carrying its status and message: INVALID_ARGUMENT
	// for a KeyField without a MaxInFlightPerKey (or the reverse), a field
	// over its name limit or equal to the reserved `id` field, with NoAck, or
	// on a sharded stream; FAILED_PRECONDITION for a field or limit other
	// than the one the group's consumers on that sidecar use.
	KeyField string
	// MaxInFlightPerKey is the most entries of one key held at once in the
	// group (entries), with KeyField; 1 handles each key's entries one at a
	// time, in order. Required with KeyField (0 is sent as 0, which the
	// sidecar refuses then); see KeyField.
	MaxInFlightPerKey uint32

	// Reconnect paces the attempts to re-open the call after it broke.
	// Zero: 100 ms doubling to 5 s, jittered (see [Backoff]).
	Reconnect Backoff
	// OnVerdictError receives every verdict the sidecar did not apply (an
	// unknown id, an entry no longer pending, …). It runs on the receiving
	// goroutine: keep it short and do not block. nil: logged at warning level.
	OnVerdictError func(VerdictError)
	// Logger receives reconnects and dropped verdicts. nil: [slog.Default].
	Logger *slog.Logger
}

func (cfg *ConsumerConfig) validate() error {
	var problems []string
	if cfg.Conn == nil && cfg.Target == "" {
		problems = append(problems, "Target or Conn is required")
	}
	if cfg.Stream == "" {
		problems = append(problems, "Stream is required")
	}
	if cfg.Group == "" {
		problems = append(problems, "Group is required")
	}
	if cfg.Start.IsZero() {
		problems = append(problems, "Start is required (StartNew, StartBeginning, StartAfter or StartAt): there is no default")
	} else if cfg.Start.kind == pb.GroupStart_GROUP_START_ID && cfg.Start.id == "" {
		problems = append(problems, "StartAfter needs a stream id")
	}
	if cfg.flow().Concurrency < 0 {
		problems = append(problems, "Concurrency must not be negative")
	}
	if cfg.MaxInFlight != 0 && cfg.FlowControl.MaxInFlight != 0 ||
		cfg.Concurrency != 0 && cfg.FlowControl.Concurrency != 0 ||
		cfg.MaxBatch != 0 && cfg.FlowControl.MaxBatch != 0 {
		problems = append(problems, "a flow setting is set both in FlowControl and in its deprecated flat field: set FlowControl only")
	}
	if cfg.AckBatch < 0 {
		problems = append(problems, "AckBatch must not be negative")
	}
	if cfg.AckDeadline < 0 || cfg.RetryBackoffInitial < 0 || cfg.RetryBackoffMax < 0 {
		problems = append(problems, "durations must not be negative")
	}
	if len(problems) > 0 {
		return fmt.Errorf("%w: %v", ErrInvalidConfig, problems)
	}
	return nil
}

func (cfg *ConsumerConfig) subscribe() *pb.ConsumeRequest {
	sub := &pb.Subscribe{
		Stream:            cfg.Stream,
		Group:             cfg.Group,
		MaxInFlight:       cfg.flow().MaxInFlight,
		DeadLetterStream:  cfg.DeadLetterStream,
		MaxDeliveries:     cfg.MaxDeliveries,
		NoAck:             cfg.NoAck,
		KeyField:          cfg.KeyField,
		MaxInFlightPerKey: cfg.MaxInFlightPerKey,
		MaxBatch:          cfg.maxBatch(),
	}
	cfg.Start.apply(sub)
	if cfg.AckDeadline > 0 {
		sub.AckDeadline = durationpb.New(cfg.AckDeadline)
	}
	if cfg.RetryBackoffInitial > 0 {
		sub.RetryBackoffInitial = durationpb.New(cfg.RetryBackoffInitial)
	}
	if cfg.RetryBackoffMax > 0 {
		sub.RetryBackoffMax = durationpb.New(cfg.RetryBackoffMax)
	}
	return &pb.ConsumeRequest{Kind: &pb.ConsumeRequest_Subscribe{Subscribe: sub}}
}

// maxBatch is the Subscribe.max_batch asked for.
func (cfg *ConsumerConfig) maxBatch() uint32 {
	f := cfg.flow()
	if f.MaxBatch > 0 {
		return f.MaxBatch
	}
	if f.MaxInFlight > 0 && f.MaxInFlight < DefaultMaxBatch {
		return f.MaxInFlight
	}
	return DefaultMaxBatch
}

// Consumer runs a handler over one subscription, one Consume call at a time,
// re-opening the call when it breaks. Create it with [NewConsumer]; it runs
// once.
type Consumer struct {
	cfg ConsumerConfig
	log *slog.Logger

	// stopping is closed by Stop: take no new work.
	stopping chan struct{}
	stopOnce sync.Once
	// expired is closed when a Stop's context ends first: the running
	// handlers lose their verdicts; those already given still go out.
	expired    chan struct{}
	expireOnce sync.Once
	// closedClean is set when a stopping call was ended by the sidecar after
	// its half-close: every verdict sent on it was applied.
	closedClean atomic.Bool
	// done is closed when Run returns.
	done chan struct{}

	mu sync.Mutex
	// ran is set by the first Run; abort cancels everything Run started.
	ran   bool
	abort context.CancelFunc
	// current is the subscribed call, nil between calls; changed is closed
	// and replaced whenever current changes.
	current *call
	changed chan struct{}
	// pool is the handler workers, shared by the calls (a handler of a
	// broken call may still run while the next call delivers). Started on
	// the first subscribe.
	pool *pool

	// handler or batchHandler is what Run or RunBatch runs; set before the
	// first call.
	handler      Handler
	batchHandler BatchHandler
}

// NewConsumer returns a consumer for cfg. It does not connect: [Consumer.Run]
// checks cfg and opens the call.
func NewConsumer(cfg ConsumerConfig) *Consumer {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Consumer{
		cfg:      cfg,
		log:      log.With("stream", cfg.Stream, "group", cfg.Group),
		stopping: make(chan struct{}),
		expired:  make(chan struct{}),
		done:     make(chan struct{}),
		changed:  make(chan struct{}),
	}
}

// Run subscribes and runs h on every delivery, at most Concurrency at once,
// until one of:
//
//   - [Consumer.Stop] was called: Run returns nil once the stop is done;
//   - ctx is cancelled: an abrupt end, like a crash. Handlers' contexts are
//     cancelled, no verdict is sent for what they hold (it stays pending and is
//     delivered again), and Run returns ctx.Err();
//   - the sidecar refused the subscription with a permanent code: Run returns a
//     [*SubscriptionError] (INVALID_ARGUMENT, PERMISSION_DENIED,
//     UNAUTHENTICATED, FAILED_PRECONDITION, …; see [IsPermanent]);
//   - cfg is invalid: an error wrapping [ErrInvalidConfig].
//
// Every other end of the call (UNAVAILABLE, a refused connection, a sidecar
// restart) is retried with [ConsumerConfig.Reconnect] backoff, re-subscribing
// with the same settings. Deliveries of a broken call are never settled on the
// next one: their verdicts are dropped ([ErrCallEnded]) and the sidecar
// delivers the entries again.
//
// When Run returns, no handler is running, except after an abrupt end, where
// handlers that ignore their context may still be returning.
func (c *Consumer) Run(ctx context.Context, h Handler) error {
	return c.run(ctx, h, nil)
}

// RunBatch is [Consumer.Run] with a [BatchHandler]: h gets the deliveries of
// each frame together (1 to MaxBatch of them) and returns their verdicts, at
// most Concurrency batches at once. Everything else (Stop, reconnects, errors,
// coalesced acks) is as for Run. For handlers that process in bulk, such as
// one database write per batch.
func (c *Consumer) RunBatch(ctx context.Context, h BatchHandler) error {
	return c.run(ctx, nil, h)
}

func (c *Consumer) run(ctx context.Context, h Handler, bh BatchHandler) error {
	c.mu.Lock()
	if c.ran {
		c.mu.Unlock()
		return ErrRunTwice
	}
	c.ran = true
	runCtx, abort := context.WithCancel(ctx)
	c.abort = abort
	c.handler, c.batchHandler = h, bh
	c.mu.Unlock()
	defer close(c.done)
	defer abort()

	if h == nil && bh == nil {
		return fmt.Errorf("%w: the handler is nil", ErrInvalidConfig)
	}
	if err := c.cfg.validate(); err != nil {
		return err
	}
	conn := c.cfg.Conn
	if conn == nil {
		cc, err := Dial(c.cfg.Target)
		if err != nil {
			return fmt.Errorf("%w: target %q: %v", ErrInvalidConfig, c.cfg.Target, err)
		}
		defer cc.Close()
		conn = cc
	}
	err := c.loop(ctx, runCtx, pb.NewConsumerServiceClient(conn))
	if c.isExpired() {
		// Stop's deadline passed: the call has carried the verdicts given
		// before it; do not wait for handlers that ignore their context.
		abort()
	}
	c.waitHandlers(runCtx)
	return err
}

// Stop ends Run gracefully: no new delivery is handed to a handler; running
// handlers finish and their verdicts are sent; then the call is closed and
// Run returns. Deliveries that had arrived but not yet started are not
// handled: right after the Drain the consumer gives them back in one
// Release, and the group's other consumers (this sidecar's other calls, or a
// peer sidecar's next reclaim beat) get them at once, with the Attempts they
// had, so a rolling restart costs no attempt and no wait for the sidecar's
// --reclaim-min-idle-ms. (With NoAck nothing is pending: nothing is released.)
//
// If ctx ends first, the handlers still running lose their verdicts: from
// that moment the call refuses new ones ([ErrCallEnded]) and their contexts
// are cancelled, so a handler that gives up and returns nil acknowledges
// nothing; their entries stay pending and are delivered again. Every verdict
// given before the deadline (acks waiting in the coalescing window, fails,
// dead letters) still goes out on the call, which is then half-closed; Stop
// waits until the sidecar has applied them and ended the call (milliseconds;
// at most 1 s more should the call be broken, which is then dropped and the
// verdicts it had not applied are lost with it, their entries coming back
// too). Run then returns nil, and Stop an error wrapping ctx.Err(). Neither
// waits for handlers that ignore their context.
//
// Stop before Run makes Run return nil at once. Stop may be called more than
// once and from any goroutine.
func (c *Consumer) Stop(ctx context.Context) error {
	c.stopOnce.Do(func() { close(c.stopping) })
	c.mu.Lock()
	ran, abort := c.ran, c.abort
	c.mu.Unlock()
	if !ran {
		return nil
	}
	select {
	case <-c.done:
		return nil
	case <-ctx.Done():
	}
	select {
	case <-c.done: // it ended as the deadline came
		return nil
	default:
	}
	c.expireOnce.Do(func() { close(c.expired) })
	grace := time.NewTimer(stopCloseGrace)
	defer grace.Stop()
	select {
	case <-c.done:
		if c.closedClean.Load() {
			return fmt.Errorf("echomq: stop: the deadline passed before the call ended: handlers still running were cancelled and "+
				"their entries stay pending (delivered again); the verdicts given before it were sent and applied: %w", ctx.Err())
		}
		return fmt.Errorf("echomq: stop: the deadline passed before the call ended: handlers still running were cancelled; "+
			"what the call held without an applied verdict stays pending (delivered again): %w", ctx.Err())
	case <-grace.C:
		abort()
		<-c.done
		return fmt.Errorf("echomq: stop: the deadline passed before the call ended, and the call did not end within %v after it: "+
			"it was dropped, and every entry it held whose verdict the sidecar had not applied stays pending (delivered again): %w",
			stopCloseGrace, ctx.Err())
	}
}

// Send is the low-level escape hatch: it sends a raw Ack, Fail or Extend on
// the current call, with no bookkeeping (a delivery settled this way is still
// settled again by its handler's return). It waits until a call is
// subscribed, or ctx ends. An id the call does not hold is answered with a
// [VerdictError] (UNKNOWN_ID) through [ConsumerConfig.OnVerdictError]; the call
// goes on.
func (c *Consumer) Send(ctx context.Context, req *pb.ConsumeRequest) error {
	switch req.GetKind().(type) {
	case *pb.ConsumeRequest_Ack, *pb.ConsumeRequest_Fail, *pb.ConsumeRequest_Extend:
	default:
		return errors.New("echomq: Send takes an Ack, Fail or Extend; the consumer sends its Subscribe itself")
	}
	for {
		c.mu.Lock()
		current, changed := c.current, c.changed
		c.mu.Unlock()
		if current != nil {
			return current.send(req)
		}
		select {
		case <-changed:
		case <-c.done:
			return ErrNotRunning
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// loop opens calls until a graceful stop, a permanent error or ctx's end.
// parent is Run's context; ctx is also cancelled by a Stop past its deadline.
func (c *Consumer) loop(parent, ctx context.Context, client pb.ConsumerServiceClient) error {
	backoff := c.cfg.Reconnect.withDefaults()
	for attempt := 0; ; {
		if c.isStopping() {
			return nil
		}
		k, err := c.open(ctx, client)
		if err == nil {
			attempt = 0
			c.setCurrent(k)
			err = k.serve()
			c.setCurrent(nil)
			if err == nil {
				return nil
			}
		}
		if parent.Err() != nil {
			return parent.Err()
		}
		if c.isStopping() {
			return nil
		}
		var refused *SubscriptionError
		if errors.As(err, &refused) {
			return err
		}
		delay := backoff.Delay(attempt)
		attempt++
		c.log.Warn("echomq: consume call ended; reconnecting", "error", err, "retry_in", delay, "attempt", attempt)
		timer := time.NewTimer(delay)
		select {
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
		case <-c.stopping:
			timer.Stop()
		}
	}
}

// open starts a call, subscribes and waits for Subscribed.
func (c *Consumer) open(ctx context.Context, client pb.ConsumerServiceClient) (*call, error) {
	// The call's end is its handlers' cancellation cause (ErrCallEnded),
	// unless Run's context or a Stop deadline ended first.
	callCtx, cancelCause := context.WithCancelCause(ctx)
	cancel := func() { cancelCause(ErrCallEnded) }
	// A Stop while the subscribe is on its way abandons it: no work was taken.
	opened := make(chan struct{})
	go func() {
		select {
		case <-c.stopping:
			cancel()
		case <-opened:
		}
	}()
	defer close(opened)

	// The codec decodes delivery frames by hand (codec.go): the unmarshal was
	// the client's largest cost per delivery.
	codec := newConsumeCodec()
	stream, err := client.Consume(callCtx, grpc.ForceCodecV2(codec))
	if err != nil {
		cancel()
		return nil, c.callError(err)
	}
	if err := stream.Send(c.cfg.subscribe()); err != nil {
		// Send reports only that the call is over; Recv says why.
		_, err = stream.Recv()
		cancel()
		return nil, c.callError(err)
	}
	first, err := stream.Recv()
	if err != nil {
		cancel()
		return nil, c.callError(err)
	}
	subscribed := first.GetSubscribed()
	if subscribed == nil {
		cancel()
		return nil, fmt.Errorf("echomq: the sidecar answered the subscribe with %T instead of Subscribed", first.GetKind())
	}
	effective := int(subscribed.GetMaxInFlight())
	if effective == 0 {
		effective = int(c.cfg.flow().MaxInFlight)
	}
	if effective == 0 {
		effective = DefaultMaxInFlight
	}
	c.log.Debug("echomq: subscribed", "consumer", subscribed.GetConsumer(), "max_in_flight", effective)
	k := newCall(c, stream, callCtx, cancel, effective)
	k.codec = codec
	return k, nil
}

// callError turns the end of a call into Run's error: a permanent code becomes
// a SubscriptionError, anything else is retried.
func (c *Consumer) callError(err error) error {
	if st, ok := status.FromError(err); ok && IsPermanent(st.Code()) {
		return &SubscriptionError{Stream: c.cfg.Stream, Group: c.cfg.Group, Status: st}
	}
	return err
}

func (c *Consumer) setCurrent(k *call) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.current = k
	close(c.changed)
	c.changed = make(chan struct{})
}

func (c *Consumer) isExpired() bool {
	select {
	case <-c.expired:
		return true
	default:
		return false
	}
}

func (c *Consumer) isStopping() bool {
	select {
	case <-c.stopping:
		return true
	default:
		return false
	}
}

// waitHandlers ends the handler workers and waits for them unless ctx ended
// (an abrupt end does not wait for handlers that ignore their context).
func (c *Consumer) waitHandlers(ctx context.Context) {
	c.mu.Lock()
	p := c.pool
	c.mu.Unlock()
	if p == nil {
		return
	}
	p.stop()
	idle := make(chan struct{})
	go func() {
		p.wg.Wait()
		close(idle)
	}()
	select {
	case <-idle:
	case <-ctx.Done():
	}
}

func (c *Consumer) verdictError(e VerdictError) {
	if c.cfg.OnVerdictError != nil {
		c.cfg.OnVerdictError(e)
		return
	}
	c.log.Warn("echomq: verdict not applied", "id", e.ID, "code", CodeName(e.Code), "message", e.Message)
}
