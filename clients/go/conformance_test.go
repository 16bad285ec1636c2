package echomq_test

// The conformance runner: every scenario of ../../tests/conformance/scenarios.json
// against the real sidecar and redis-server of the fixture. A key, step or
// action this runner does not know fails the scenario instead of skipping it.

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	echomq "github.com/echomq/echomq-sidecar/clients/go"
	pb "github.com/echomq/echomq-sidecar/clients/go/echomqv1"
)

const (
	conformanceGroup = "conformance"
	stepLimit        = 30 * time.Second
	finalStopLimit   = 15 * time.Second
)

// conformanceRuns counts TestConformance runs in this process.
var conformanceRuns int

type scenarioFile struct {
	Version     int               `json:"version"`
	About       string            `json:"about"`
	SidecarArgs []string          `json:"sidecar_args"`
	Scenarios   []json.RawMessage `json:"scenarios"`
}

type scenario struct {
	Name               string       `json:"name"`
	Description        string       `json:"description"`
	Append             []entrySpec  `json:"append"`
	AppendAfterRestart []entrySpec  `json:"append_after_restart"`
	AppendCalls        []appendCall `json:"append_calls"`
	AppendGenerated    *struct {
		Count int    `json:"count"`
		Field string `json:"field"`
	} `json:"append_generated"`
	Consumer struct {
		MaxInFlight   uint32 `json:"max_in_flight"`
		Concurrency   int    `json:"concurrency"`
		MaxDeliveries uint32 `json:"max_deliveries"`
		// KeyField and MaxInFlightPerKey are the per-key limits.
		KeyField          string `json:"key_field"`
		MaxInFlightPerKey uint32 `json:"max_in_flight_per_key"`
	} `json:"consumer"`
	Handler struct {
		Default   *action           `json:"default"`
		ByAttempt map[string]action `json:"by_attempt"`
		ByCall    map[string]action `json:"by_call"`
	} `json:"handler"`
	Steps  []string                   `json:"steps"`
	Expect map[string]json.RawMessage `json:"expect"`
}

type entrySpec struct {
	Fields map[string]valueSpec `json:"fields"`
}

// appendCall is one of append_calls: a single Append or one batch.
type appendCall struct {
	Append      *keyedEntrySpec  `json:"append"`
	AppendBatch []keyedEntrySpec `json:"append_batch"`
}

// keyedEntrySpec is an entry of append_calls: it may carry a dedup key, and
// says whether its answer must be a duplicate.
type keyedEntrySpec struct {
	entrySpec
	DedupKey  string `json:"dedup_key"`
	Duplicate bool   `json:"duplicate"`
	// DelayMs is sent as the entry's delay, DeliverInMs as a deliver-at
	// instant that many milliseconds from now; Scheduled is the answer's
	// expected flag, Ref names the entry for the cancel steps.
	DelayMs     *int64 `json:"delay_ms"`
	DeliverInMs *int64 `json:"deliver_in_ms"`
	Scheduled   bool   `json:"scheduled"`
	Ref         string `json:"ref"`
}

// schedule is the entry's DeliverInMs and DelayMs as the client's types.
func (e keyedEntrySpec) schedule() (deliverAt time.Time, delay time.Duration) {
	if e.DeliverInMs != nil {
		deliverAt = time.Now().Add(time.Duration(*e.DeliverInMs) * time.Millisecond)
	}
	if e.DelayMs != nil {
		delay = time.Duration(*e.DelayMs) * time.Millisecond
	}
	return deliverAt, delay
}

type valueSpec struct {
	UTF8   *string `json:"utf8"`
	Base64 *string `json:"base64"`
	Repeat *struct {
		Byte  int `json:"byte"`
		Count int `json:"count"`
	} `json:"repeat"`
	AllBytes *bool `json:"all_bytes"`
}

type action struct {
	Action       string `json:"action"`
	Kind         string `json:"kind"`
	Message      string `json:"message"`
	RetryAfterMs int    `json:"retry_after_ms"`
	Reason       string `json:"reason"`
	Ms           int    `json:"ms"`
	MsRandomMax  *int   `json:"ms_random_max"`
	// Fields are the ack_emit action's emit's fields (the runner adds
	// `source`, the delivery's branded id).
	Fields map[string]valueSpec `json:"fields"`
}

func (v valueSpec) bytes() ([]byte, error) {
	switch {
	case v.UTF8 != nil:
		return []byte(*v.UTF8), nil
	case v.Base64 != nil:
		return base64.StdEncoding.DecodeString(*v.Base64)
	case v.Repeat != nil:
		return bytes.Repeat([]byte{byte(v.Repeat.Byte)}, v.Repeat.Count), nil
	case v.AllBytes != nil && *v.AllBytes:
		all := make([]byte, 256)
		for i := range all {
			all[i] = byte(i)
		}
		return all, nil
	}
	return nil, errors.New("a field value needs utf8, base64, repeat or all_bytes")
}

func (e entrySpec) fields() (map[string][]byte, error) {
	out := make(map[string][]byte, len(e.Fields))
	for name, v := range e.Fields {
		b, err := v.bytes()
		if err != nil {
			return nil, fmt.Errorf("field %q: %w", name, err)
		}
		out[name] = b
	}
	return out, nil
}

// actionFor is the action for the n-th call for a delivery's id (by_call)
// with attempts (by_attempt), else the default.
func (s *scenario) actionFor(n int, attempts uint32) (action, bool) {
	if a, ok := s.Handler.ByCall[strconv.Itoa(n)]; ok {
		return a, true
	}
	if a, ok := s.Handler.ByAttempt[strconv.Itoa(int(attempts))]; ok {
		return a, true
	}
	if s.Handler.Default != nil {
		return *s.Handler.Default, true
	}
	return action{}, false
}

// failKinds are the explicit fail action's kinds (clients/CONTRACT.md,
// "Failure kinds").
var failKinds = map[string]echomq.FailKind{
	"message":   echomq.FailKindMessage,
	"transient": echomq.FailKindTransient,
	"poison":    echomq.FailKindPoison,
}

func TestConformance(t *testing.T) {
	var file scenarioFile
	path := filepath.Join(repoRoot(), "tests", "conformance", "scenarios.json")
	if err := readJSON(path, &file); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if file.Version != 1 {
		t.Fatalf("scenarios.json version %d: this runner knows version 1", file.Version)
	}
	if len(file.Scenarios) == 0 {
		t.Fatal("scenarios.json has no scenarios")
	}
	cl := fixture(t)
	// Streams are conf:go:<scenario>, as the suite says; a repeated run in the
	// same process (go test -count=N) appends :<run> so it starts clean.
	conformanceRuns++
	suffix := ""
	if conformanceRuns > 1 {
		suffix = ":" + strconv.Itoa(conformanceRuns)
	}
	for i, raw := range file.Scenarios {
		var sc scenario
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&sc); err != nil {
			t.Errorf("scenario %d: this runner cannot read it: %v", i, err)
			continue
		}
		t.Run(sc.Name, func(t *testing.T) {
			r := &run{t: t, sc: &sc, cl: cl, stream: "conf:go:" + sc.Name + suffix, appended: map[string]map[string][]byte{},
				wire: &wire{}, release: make(chan struct{}), leaseLost: map[string]int{}}
			defer r.cleanup()
			r.execute()
		})
	}
}

// call is one handler call as the handler recorded it.
type call struct {
	id, streamID string
	attempts     uint32
	payload      map[string][]byte
	// started and finished bound the call (finished: when its action
	// returned, or when a hang began).
	started, finished time.Time
}

// leaseLostWait bounds the wait_lease_lost action.
const leaseLostWait = 30 * time.Second

// consumerRun is one running consumer of a scenario.
type consumerRun struct {
	consumer *echomq.Consumer
	conn     *grpc.ClientConn
	cancel   context.CancelFunc
	done     chan error
	// ended: Run returned because the runner stopped or dropped it.
	ended bool
}

// run is one scenario's state.
type run struct {
	t        *testing.T
	sc       *scenario
	cl       *cluster
	stream   string
	producer *echomq.Streams
	pconn    *grpc.ClientConn

	mu            sync.Mutex
	appended      map[string]map[string][]byte   // branded id → fields
	firstByKey    map[string]echomq.AppendResult // dedup key → the answer that wrote it
	byRef         map[string]echomq.AppendResult // an append_calls entry's ref → its answer
	scheduledIDs  map[string]bool                // ids answered Scheduled
	calls         []call
	finished      int
	finishedIDs   map[string]bool
	callsByID     map[string]int // handler calls per branded id, for by_call
	running       int
	maxRunning    int
	verdictErrors []string
	// emitted holds every entry AckEmit returned; ackEmitRefusals the codes
	// of the AckEmitErrors the handler saw.
	emitted         []echomq.EmittedEntry
	ackEmitRefusals []string
	// leaseLost counts, per branded id, the handler calls that saw their
	// delivery's lease-lost signal (ctx cancelled with cause ErrLeaseLost).
	leaseLost map[string]int
	wire      *wire // what the consumers' connections sent and received
	badAction string
	stopTook  time.Duration
	stopped   bool
	// consumerErr is what Run returned by itself (wait_consumer_error).
	consumerErr error

	consumers []*consumerRun
	// release ends "hang" handlers when the scenario is over.
	release chan struct{}
}

func (r *run) execute() {
	t := r.t
	var err error
	if r.pconn, err = echomq.Dial(r.cl.listen); err != nil {
		t.Fatalf("dial: %v", err)
	}
	r.producer = echomq.NewStreams(r.pconn)
	r.finishedIDs = map[string]bool{}
	r.callsByID = map[string]int{}

	var initial []map[string][]byte
	for i, e := range r.sc.Append {
		fields, err := e.fields()
		if err != nil {
			t.Fatalf("append[%d]: %v", i, err)
		}
		initial = append(initial, fields)
	}
	if g := r.sc.AppendGenerated; g != nil {
		for i := range g.Count {
			initial = append(initial, map[string][]byte{g.Field: []byte(strconv.Itoa(i))})
		}
	}
	if len(initial) > 0 {
		r.append(initial, false)
	}
	for i, c := range r.sc.AppendCalls {
		r.appendCall(i, c)
		if t.Failed() {
			return
		}
	}

	steps := r.sc.Steps
	if steps == nil {
		n, ok := r.expectInt("handled")
		if !ok {
			n, ok = r.expectInt("distinct_handled")
		}
		if !ok {
			t.Fatal("a scenario without steps needs expect.handled or expect.distinct_handled")
		}
		steps = []string{"start_consumer", "wait_handled:" + strconv.Itoa(n)}
	}
	for _, step := range steps {
		r.step(step)
		if t.Failed() {
			return
		}
	}
	r.stopAll()
	r.check()
}

func (r *run) step(step string) {
	t := r.t
	name, arg, _ := strings.Cut(step, ":")
	num := func() int {
		n, err := strconv.Atoi(arg)
		if err != nil {
			t.Fatalf("step %q: %q is not a number", step, arg)
		}
		return n
	}
	switch name {
	case "start_consumer", "start_second_consumer":
		r.startConsumer()
	case "wait_handled":
		n := num()
		r.waitUntil(step, func() bool {
			if _, distinct := r.sc.Expect["distinct_handled"]; distinct && r.sc.Expect["handled"] == nil {
				return len(r.finishedIDs) >= n
			}
			return r.finished >= n
		})
	case "wait_started":
		n := num()
		r.waitUntil(step, func() bool { return len(r.calls) >= n })
	case "drop_connection":
		c := r.current()
		c.cancel()
		_ = c.conn.Close()
		select {
		case err := <-c.done:
			if !errors.Is(err, context.Canceled) {
				t.Errorf("after drop_connection Run returned %v, want context.Canceled", err)
			}
		case <-time.After(stepLimit):
			t.Fatal("Run did not return after its context was cancelled")
		}
		c.ended = true
	case "stop":
		took := r.stop(r.current(), num())
		r.mu.Lock()
		r.stopTook, r.stopped = took, true
		r.mu.Unlock()
	case "stop_first":
		r.stop(r.consumers[0], num())
	case "wait_consumer_error":
		c := r.current()
		select {
		case err := <-c.done:
			if err == nil {
				t.Fatal("wait_consumer_error: Run returned nil, want an error")
			}
			r.mu.Lock()
			r.consumerErr = err
			r.mu.Unlock()
		case <-time.After(stepLimit):
			t.Fatalf("wait_consumer_error: Run did not return by itself within %v", stepLimit)
		}
		c.ended = true
		_ = c.conn.Close()
		c.cancel()
	case "kill_sidecar":
		r.cl.killSidecar()
	case "restart_sidecar":
		if err := r.cl.startSidecar(); err != nil {
			t.Fatalf("restart_sidecar: %v", err)
		}
	case "append_after_restart":
		var entries []map[string][]byte
		for i, e := range r.sc.AppendAfterRestart {
			fields, err := e.fields()
			if err != nil {
				t.Fatalf("append_after_restart[%d]: %v", i, err)
			}
			entries = append(entries, fields)
		}
		r.append(entries, true)
	case "append_more":
		n := num()
		var entries []map[string][]byte
		for i := range n {
			entries = append(entries, map[string][]byte{"n": []byte(strconv.Itoa(i))})
		}
		r.append(entries, false)
	case "ack_unknown":
		req := &pb.ConsumeRequest{Kind: &pb.ConsumeRequest_Ack{Ack: &pb.Ack{Ids: []string{arg}}}}
		if err := r.current().consumer.Send(withTimeout(t, stepLimit), req); err != nil {
			t.Fatalf("raw ack: %v", err)
		}
	case "steal":
		// A peer named thief takes the entry whose handler started last.
		r.mu.Lock()
		if len(r.calls) == 0 {
			r.mu.Unlock()
			t.Fatal("steal: no handler has started")
		}
		last := r.calls[len(r.calls)-1]
		r.mu.Unlock()
		reply, err := redisDo(r.cl.redisAddr, "XCLAIM", r.stream, conformanceGroup, "thief", "0", last.streamID)
		if err != nil {
			t.Fatalf("steal: XCLAIM: %v", err)
		}
		if got, _ := reply.([]any); len(got) != 1 {
			t.Fatalf("steal: XCLAIM of %s claimed %v, want the entry", last.streamID, reply)
		}
	case "wait_verdict_error":
		r.waitUntil(step, func() bool { return slices.Contains(r.verdictErrors, arg) })
	case "sleep":
		time.Sleep(time.Duration(num()) * time.Millisecond)
	case "assert_handled":
		r.mu.Lock()
		got := len(r.calls)
		r.mu.Unlock()
		if got != num() {
			t.Fatalf("%s: %d handler calls so far", step, got)
		}
	case "assert_scheduled":
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var listed []string
		for e, err := range r.producer.Scheduled(ctx, r.stream, echomq.ListScheduledOptions{}) {
			if err != nil {
				t.Fatalf("%s: %v", step, err)
			}
			listed = append(listed, e.ID)
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		if len(listed) != num() {
			t.Fatalf("%s: ListScheduled listed %v", step, listed)
		}
		for _, id := range listed {
			if !r.scheduledIDs[id] {
				t.Fatalf("%s: listed %s, which no append answered scheduled", step, id)
			}
		}
	case "cancel_scheduled", "cancel_scheduled_not_found":
		r.mu.Lock()
		target, ok := r.byRef[arg]
		r.mu.Unlock()
		if !ok {
			t.Fatalf("%s: no append_calls entry has ref %q", step, arg)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		due, err := r.producer.CancelScheduled(ctx, target.Stream, target.ID)
		if name == "cancel_scheduled_not_found" {
			if !errors.Is(err, echomq.ErrNotScheduled) || status.Code(err) != codes.NotFound {
				t.Fatalf("%s: got %v, want ErrNotScheduled with NOT_FOUND", step, err)
			}
			return
		}
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		if due.Before(time.Now().Add(-time.Second)) {
			t.Fatalf("%s: the cancelled entry was due at %v", step, due)
		}
		r.mu.Lock()
		delete(r.appended, target.ID) // never to be handled
		r.mu.Unlock()
	default:
		t.Fatalf("unknown step %q: this runner cannot run it", step)
	}
}

// append writes entries with the producer: Append for one, AppendBatch for
// several. retry: keep trying while the sidecar comes back.
func (r *run) append(entries []map[string][]byte, retry bool) {
	t := r.t
	deadline := time.Now().Add(stepLimit)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		var got []echomq.AppendResult
		var err error
		if len(entries) == 1 {
			var one echomq.AppendResult
			one, err = r.producer.Append(ctx, r.stream, entries[0])
			got = []echomq.AppendResult{one}
		} else {
			got, err = r.producer.AppendBatch(ctx, r.stream, entries)
		}
		cancel()
		if err == nil {
			if len(got) != len(entries) {
				t.Fatalf("append: %d results for %d entries", len(got), len(entries))
			}
			r.mu.Lock()
			for i, a := range got {
				if len(a.ID) != 28 || a.StreamID == "" {
					t.Errorf("append returned id %q stream id %q", a.ID, a.StreamID)
				}
				r.appended[a.ID] = entries[i]
			}
			r.mu.Unlock()
			return
		}
		if !retry || time.Now().After(deadline) {
			t.Fatalf("append: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// appendCall makes one of append_calls and checks each answer: Duplicate as
// the entry says, a duplicate carrying the ids of the first answer with its
// key, and no id answered twice otherwise.
func (r *run) appendCall(i int, c appendCall) {
	t := r.t
	var specs []keyedEntrySpec
	var got []echomq.AppendResult
	var err error
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	switch {
	case c.Append != nil && c.AppendBatch == nil:
		specs = []keyedEntrySpec{*c.Append}
		fields, ferr := c.Append.fields()
		if ferr != nil {
			t.Fatalf("append_calls[%d]: %v", i, ferr)
		}
		var one echomq.AppendResult
		deliverAt, delay := c.Append.schedule()
		one, err = r.producer.Append(ctx, r.stream, fields, echomq.AppendOptions{DedupKey: c.Append.DedupKey, DeliverAt: deliverAt, Delay: delay})
		got = []echomq.AppendResult{one}
	case c.Append == nil && c.AppendBatch != nil:
		specs = c.AppendBatch
		entries := make([]echomq.BatchEntry, len(specs))
		for j, e := range specs {
			fields, ferr := e.fields()
			if ferr != nil {
				t.Fatalf("append_calls[%d][%d]: %v", i, j, ferr)
			}
			deliverAt, delay := e.schedule()
			entries[j] = echomq.BatchEntry{Fields: fields, DedupKey: e.DedupKey, DeliverAt: deliverAt, Delay: delay}
		}
		got, err = r.producer.AppendBatchEntries(ctx, r.stream, entries)
	default:
		t.Fatalf("append_calls[%d]: needs exactly one of append and append_batch", i)
	}
	if err != nil {
		t.Fatalf("append_calls[%d]: %v", i, err)
	}
	if len(got) != len(specs) {
		t.Fatalf("append_calls[%d]: %d results for %d entries", i, len(got), len(specs))
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.firstByKey == nil {
		r.firstByKey = map[string]echomq.AppendResult{}
		r.byRef = map[string]echomq.AppendResult{}
		r.scheduledIDs = map[string]bool{}
	}
	for j, a := range got {
		e := specs[j]
		if a.Scheduled != e.Scheduled {
			t.Errorf("append_calls[%d][%d]: Scheduled %v, want %v", i, j, a.Scheduled, e.Scheduled)
		}
		if a.Scheduled {
			if a.StreamID != "" {
				t.Errorf("append_calls[%d][%d]: a scheduled entry's answer has stream id %q", i, j, a.StreamID)
			}
			r.scheduledIDs[a.ID] = true
		}
		if e.Ref != "" {
			r.byRef[e.Ref] = a
		}
		if a.Duplicate != e.Duplicate {
			t.Errorf("append_calls[%d][%d] (key %q): Duplicate %v, want %v", i, j, e.DedupKey, a.Duplicate, e.Duplicate)
			continue
		}
		if e.Duplicate {
			first, ok := r.firstByKey[e.DedupKey]
			if !ok || a.ID != first.ID || a.StreamID != first.StreamID {
				t.Errorf("append_calls[%d][%d]: the duplicate of %q answered %+v, the first was %+v", i, j, e.DedupKey, a, first)
			}
			continue
		}
		if _, twice := r.appended[a.ID]; twice {
			t.Errorf("append_calls[%d][%d]: id %s answered twice without Duplicate", i, j, a.ID)
		}
		if e.DedupKey != "" {
			r.firstByKey[e.DedupKey] = a
		}
		fields, _ := e.fields()
		r.appended[a.ID] = fields
	}
}

func (r *run) startConsumer() {
	t := r.t
	conn, err := echomq.Dial(r.cl.listen, grpc.WithStreamInterceptor(r.wire.intercept))
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	consumer := echomq.NewConsumer(echomq.ConsumerConfig{
		Conn:              conn,
		Stream:            r.stream,
		Group:             conformanceGroup,
		Start:             echomq.StartBeginning(),
		FlowControl:       echomq.FlowControl{MaxInFlight: r.sc.Consumer.MaxInFlight, Concurrency: r.sc.Consumer.Concurrency},
		MaxDeliveries:     r.sc.Consumer.MaxDeliveries,
		KeyField:          r.sc.Consumer.KeyField,
		MaxInFlightPerKey: r.sc.Consumer.MaxInFlightPerKey,
		OnVerdictError: func(e echomq.VerdictError) {
			r.mu.Lock()
			r.verdictErrors = append(r.verdictErrors, echomq.CodeName(e.Code))
			r.mu.Unlock()
		},
	})
	ctx, cancel := context.WithCancel(context.Background())
	c := &consumerRun{consumer: consumer, conn: conn, cancel: cancel, done: make(chan error, 1)}
	go func() { c.done <- consumer.Run(ctx, r.handle) }()
	r.consumers = append(r.consumers, c)
}

// stop stops c gracefully with a deadline of ms milliseconds, waits for its
// Run to return, and returns how long Stop took.
func (r *run) stop(c *consumerRun, ms int) time.Duration {
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(ms)*time.Millisecond)
	defer cancel()
	begin := time.Now()
	err := c.consumer.Stop(ctx)
	took := time.Since(begin)
	if err != nil {
		r.t.Errorf("stop: %v", err)
	}
	r.awaitRun(c)
	return took
}

// current is the latest consumer still running.
func (r *run) current() *consumerRun {
	for i := len(r.consumers) - 1; i >= 0; i-- {
		if !r.consumers[i].ended {
			return r.consumers[i]
		}
	}
	r.t.Fatal("no consumer is running")
	return nil
}

func (r *run) awaitRun(c *consumerRun) {
	select {
	case err := <-c.done:
		if err != nil {
			r.t.Errorf("Run returned %v after a graceful stop, want nil", err)
		}
	case <-time.After(stepLimit):
		r.t.Fatal("Run did not return after Stop")
	}
	c.ended = true
	_ = c.conn.Close()
	c.cancel()
}

// stopAll gracefully stops every consumer still running.
func (r *run) stopAll() {
	for _, c := range r.consumers {
		if c.ended {
			continue
		}
		select {
		case err := <-c.done:
			r.t.Errorf("a consumer's Run returned early: %v", err)
			c.ended = true
			continue
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), finalStopLimit)
		if err := c.consumer.Stop(ctx); err != nil {
			r.t.Errorf("final stop: %v", err)
		}
		cancel()
		r.awaitRun(c)
	}
}

func (r *run) cleanup() {
	close(r.release)
	for _, c := range r.consumers {
		if !c.ended {
			c.cancel()
			<-c.done
			_ = c.conn.Close()
		}
	}
	if r.pconn != nil {
		_ = r.pconn.Close()
	}
	if r.t.Failed() {
		r.t.Logf("sidecar log (tail):\n%s", r.cl.logTail())
	}
}

func (r *run) waitUntil(what string, ok func() bool) {
	err := waitFor(stepLimit, func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return ok()
	})
	if err != nil {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.t.Fatalf("%s: not reached within %v (calls %d, finished %d, verdict errors %v)",
			what, stepLimit, len(r.calls), r.finished, r.verdictErrors)
	}
}

// handle is the scenario's handler: it records the call, then acts as the
// scenario says for the delivery's attempts.
func (r *run) handle(ctx context.Context, d *echomq.Delivery) error {
	r.mu.Lock()
	index := len(r.calls)
	r.calls = append(r.calls, call{id: d.ID, streamID: d.StreamID, attempts: d.Attempts, payload: d.Payload, started: time.Now()})
	r.callsByID[d.ID]++
	n := r.callsByID[d.ID]
	r.running++
	r.maxRunning = max(r.maxRunning, r.running)
	r.mu.Unlock()
	finished := false
	finish := func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		if !finished {
			finished = true
			r.calls[index].finished = time.Now()
			r.finished++
			r.finishedIDs[d.ID] = true
		}
	}
	defer func() {
		finish()
		r.mu.Lock()
		r.running--
		r.mu.Unlock()
	}()

	a, ok := r.sc.actionFor(n, d.Attempts)
	if !ok {
		r.unknownAction(fmt.Sprintf("no action for attempts %d", d.Attempts))
		return errors.New("no action")
	}
	switch a.Action {
	case "return":
		return nil
	case "raise":
		err := errors.New(a.Message)
		switch a.Kind {
		case "", "message":
			return err
		case "transient":
			return echomq.Transient(err)
		case "poison":
			return echomq.Poison(err)
		}
	case "fail":
		retryAfter := time.Duration(a.RetryAfterMs) * time.Millisecond
		if a.Kind == "" {
			return d.Fail(a.Reason, retryAfter)
		}
		if kind, ok := failKinds[a.Kind]; ok {
			return d.Fail(a.Reason, retryAfter, kind)
		}
	case "dead_letter":
		return d.DeadLetter(a.Reason)
	case "ack_emit":
		fields, err := entrySpec{Fields: a.Fields}.fields()
		if err != nil {
			r.unknownAction("ack_emit: " + err.Error())
			return err
		}
		fields["source"] = []byte(d.ID)
		emitted, err := d.AckEmit(echomq.Emit{Stream: r.sink(), Fields: fields})
		r.mu.Lock()
		defer r.mu.Unlock()
		var refused *echomq.AckEmitError
		switch {
		case errors.As(err, &refused):
			r.ackEmitRefusals = append(r.ackEmitRefusals, echomq.CodeName(refused.Code))
		case err != nil:
			r.ackEmitRefusals = append(r.ackEmitRefusals, "CALL_ENDED")
		}
		r.emitted = append(r.emitted, emitted...)
		return err // a held refusal fails the delivery with its message
	case "sleep":
		ms := a.Ms
		if a.MsRandomMax != nil {
			ms = rand.IntN(*a.MsRandomMax + 1)
		}
		select {
		case <-time.After(time.Duration(ms) * time.Millisecond):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	case "wait_lease_lost":
		select {
		case <-ctx.Done():
			if errors.Is(context.Cause(ctx), echomq.ErrLeaseLost) && d.LeaseLost() {
				r.mu.Lock()
				r.leaseLost[d.ID]++
				r.mu.Unlock()
			}
		case <-time.After(leaseLostWait):
		case <-r.release:
		}
		// The client must send no verdict for it, whatever this returns.
		return nil
	case "hang":
		// A hanging call never finishes by itself; it counts as handled once
		// it hangs, so that wait_handled can see it.
		finish()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-r.release:
			return errors.New("scenario over")
		}
	}
	r.unknownAction(a.Action + " " + a.Kind)
	return errors.New("unknown action")
}

func (r *run) unknownAction(what string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.badAction = what
}

func (r *run) expectInt(key string) (int, bool) {
	raw, ok := r.sc.Expect[key]
	if !ok {
		return 0, false
	}
	var n int
	if err := json.Unmarshal(raw, &n); err != nil {
		r.t.Fatalf("expect.%s: %v", key, err)
	}
	return n, true
}

// check verifies every expectation; an unknown key is a failure.
func (r *run) check() {
	t := r.t
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.badAction != "" {
		t.Errorf("handler: unknown action %q", r.badAction)
	}
	distinct := map[string][]call{}
	for _, c := range r.calls {
		distinct[c.id] = append(distinct[c.id], c)
	}
	keys := make([]string, 0, len(r.sc.Expect))
	for k := range r.sc.Expect {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, key := range keys {
		raw := r.sc.Expect[key]
		decode := func(into any) {
			if err := json.Unmarshal(raw, into); err != nil {
				t.Fatalf("expect.%s: %v", key, err)
			}
		}
		switch key {
		case "handled":
			var n int
			decode(&n)
			if len(r.calls) != n {
				t.Errorf("handled: %d handler calls, want %d", len(r.calls), n)
			}
		case "distinct_handled":
			var n int
			decode(&n)
			if len(distinct) != n {
				t.Errorf("distinct_handled: %d distinct ids, want %d", len(distinct), n)
			}
		case "attempts":
			var want map[string]int
			decode(&want)
			got := map[string]int{}
			for _, c := range r.calls {
				got[strconv.Itoa(int(c.attempts))]++
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("attempts: %v, want %v", got, want)
			}
		case "min_redelivery_gap_ms":
			var ms int
			decode(&ms)
			seen := false
			for id, cs := range distinct {
				if len(cs) < 2 {
					continue
				}
				seen = true
				if gap := cs[1].started.Sub(cs[0].started); gap < time.Duration(ms)*time.Millisecond {
					t.Errorf("min_redelivery_gap_ms: %s came back after %v, want at least %d ms", id, gap, ms)
				}
			}
			if !seen {
				t.Errorf("min_redelivery_gap_ms: no entry was delivered twice")
			}
		case "pending_after":
			var n int64
			decode(&n)
			r.eventually(key, n, "XPENDING", r.stream, conformanceGroup)
		case "stream_length":
			var n int64
			decode(&n)
			r.eventually(key, n, "XLEN", r.stream)
		case "handled_ids_equal_appended":
			var want bool
			decode(&want)
			same := len(distinct) == len(r.appended)
			for id := range distinct {
				if _, ok := r.appended[id]; !ok {
					same = false
				}
			}
			if same != want {
				ids := make([]string, 0, len(r.appended))
				for id := range r.appended {
					ids = append(ids, id)
				}
				t.Errorf("handled_ids_equal_appended: %d distinct ids handled, %d appended (%v), want equal: %v", len(distinct), len(r.appended), ids, want)
			}
		case "dead_letters":
			var n int64
			decode(&n)
			r.eventually(key, n, "XLEN", r.stream+":dlq")
		case "dead_letter_fields":
			var want map[string]string
			decode(&want)
			fields := r.deadLetterFields()
			for k, v := range want {
				if fields[k] != v {
					t.Errorf("dead_letter_fields: %q = %q, want %q (entry %v)", k, fields[k], v, fields)
				}
			}
		case "dead_letter_keeps_branded_id":
			var want bool
			decode(&want)
			if want {
				fields := r.deadLetterFields()
				if len(r.calls) == 0 || fields["id"] != r.calls[0].id {
					t.Errorf("dead_letter_keeps_branded_id: dead letter id %q, handled %v", fields["id"], r.calls)
				}
			}
		case "each_acked_once":
			var want bool
			decode(&want)
			if want {
				acks := r.wire.acked()
				for id := range distinct {
					if acks[id] != 1 {
						t.Errorf("each_acked_once: %s acked %d times", id, acks[id])
					}
				}
				if len(acks) != len(distinct) {
					t.Errorf("each_acked_once: acks for %d ids, %d ids handled", len(acks), len(distinct))
				}
			}
		case "released":
			var want int
			decode(&want)
			released := r.wire.released()
			for id, n := range released {
				if n != 1 {
					t.Errorf("released: %s released %d times", id, n)
				}
			}
			if len(released) != want {
				t.Errorf("released: %d ids released, want %d", len(released), want)
			}
		case "payload_equals_appended":
			var want bool
			decode(&want)
			if want {
				if len(r.calls) == 0 {
					t.Errorf("payload_equals_appended: nothing handled")
				}
				for _, c := range r.calls {
					appended, ok := r.appended[c.id]
					if !ok {
						t.Errorf("payload_equals_appended: handled %s was not appended by this run", c.id)
					} else if !reflect.DeepEqual(c.payload, appended) {
						t.Errorf("payload_equals_appended: %s differs (%s)", c.id, describeDiff(c.payload, appended))
					}
				}
			}
		case "verdict_errors":
			var want []string
			decode(&want)
			if !slices.Equal(r.verdictErrors, want) {
				t.Errorf("verdict_errors: %v, want %v", r.verdictErrors, want)
			}
		case "lease_lost_signalled":
			var n int
			decode(&n)
			got := 0
			for _, k := range r.leaseLost {
				got += k
			}
			if got != n {
				t.Errorf("lease_lost_signalled: %d handler calls saw the signal, want %d", got, n)
			}
			// After the signal the client sends no verdict for that delivery:
			// the id's Acks and Fails are its other handler calls' only.
			verdicts := r.wire.verdicts()
			for id, k := range r.leaseLost {
				if want := len(distinct[id]) - k; verdicts[id] != want {
					t.Errorf("lease_lost_signalled: %d verdicts sent for %s, want %d (one per call whose lease held)", verdicts[id], id, want)
				}
			}
		case "max_concurrent_handlers":
			var n int
			decode(&n)
			if r.maxRunning > n {
				t.Errorf("max_concurrent_handlers: %d ran at once, want at most %d", r.maxRunning, n)
			}
		case "sent_max_in_flight":
			var n uint32
			decode(&n)
			got := r.wire.sentMaxInFlight()
			if len(got) == 0 || slices.ContainsFunc(got, func(m uint32) bool { return m != n }) {
				t.Errorf("sent_max_in_flight: Subscribe carried %v, want %d", got, n)
			}
		case "subscribed_max_in_flight":
			var n uint32
			decode(&n)
			got, _ := r.wire.flow()
			if len(got) == 0 {
				t.Errorf("subscribed_max_in_flight: no Subscribed received")
			}
			for _, m := range got {
				if m != n {
					t.Errorf("subscribed_max_in_flight: Subscribed reported %d, want %d", m, n)
				}
			}
		case "peak_unsettled_at_least":
			var n int
			decode(&n)
			if _, peak := r.wire.flow(); peak < n {
				t.Errorf("peak_unsettled_at_least: at most %d deliveries were un-settled at once, want at least %d", peak, n)
			}
		case "stop_returned_within_ms":
			var ms int
			decode(&ms)
			if !r.stopped {
				t.Errorf("stop_returned_within_ms: the scenario has no stop step")
			} else if r.stopTook > time.Duration(ms)*time.Millisecond {
				t.Errorf("stop_returned_within_ms: stop took %v, want at most %d ms", r.stopTook, ms)
			}
		case "sink_length":
			var n int64
			decode(&n)
			r.eventually(key, n, "XLEN", r.sink())
		case "sink_sources_equal_appended":
			var want bool
			decode(&want)
			sources := map[string]int{}
			for _, e := range r.sinkEntries() {
				sources[e.fields["source"]]++
			}
			same := len(sources) == len(r.appended)
			for id, n := range sources {
				if _, ok := r.appended[id]; !ok || n != 1 {
					same = false
				}
			}
			if same != want {
				t.Errorf("sink_sources_equal_appended: sink sources %v, %d appended; want equal: %v", sources, len(r.appended), want)
			}
		case "emitted_equal_sink":
			var want bool
			decode(&want)
			var sink, emitted []string
			for _, e := range r.sinkEntries() {
				sink = append(sink, e.fields["id"]+" "+e.id+" "+r.sink())
			}
			for _, e := range r.emitted {
				emitted = append(emitted, e.ID+" "+e.StreamID+" "+e.Stream)
			}
			slices.Sort(sink)
			slices.Sort(emitted)
			if slices.Equal(sink, emitted) != want {
				t.Errorf("emitted_equal_sink: emitted %v, sink %v; want equal: %v", emitted, sink, want)
			}
		case "ack_emit_refusals":
			var want []string
			decode(&want)
			if !slices.Equal(r.ackEmitRefusals, want) {
				t.Errorf("ack_emit_refusals: %v, want %v", r.ackEmitRefusals, want)
			}
		case "ack_emits_sent":
			var n int
			decode(&n)
			if got := r.wire.ackEmits(); got != n {
				t.Errorf("ack_emits_sent: %d AckEmit messages, want %d", got, n)
			}
		case "acks_sent":
			var n int
			decode(&n)
			got := 0
			for _, k := range r.wire.acked() {
				got += k
			}
			if got != n {
				t.Errorf("acks_sent: %d ids in Ack messages, want %d", got, n)
			}
		case "per_key_serial":
			var want struct {
				KeyField string `json:"key_field"`
				SeqField string `json:"seq_field"`
			}
			decode(&want)
			checkPerKeySerial(t, r.calls, want.KeyField, want.SeqField)
		case "max_concurrent_keys_at_least":
			var n int
			decode(&n)
			var serial struct {
				KeyField string `json:"key_field"`
			}
			if err := json.Unmarshal(r.sc.Expect["per_key_serial"], &serial); err != nil {
				t.Fatalf("max_concurrent_keys_at_least needs expect.per_key_serial: %v", err)
			}
			if got := maxConcurrentKeys(r.calls, serial.KeyField); got < n {
				t.Errorf("max_concurrent_keys_at_least: calls of at most %d keys ran at once, want at least %d", got, n)
			}
		case "consumer_error":
			var want struct {
				Code            codes.Code `json:"code"` // "INVALID_ARGUMENT" decodes
				MessageContains string     `json:"message_contains"`
			}
			decode(&want)
			var refused *echomq.SubscriptionError
			switch {
			case !errors.As(r.consumerErr, &refused):
				t.Errorf("consumer_error: Run returned %v, want a *SubscriptionError", r.consumerErr)
			case refused.Code() != want.Code:
				t.Errorf("consumer_error: code %v, want %s: %v", refused.Code(), want.Code, refused)
			case !strings.Contains(refused.Error(), want.MessageContains) || !strings.Contains(status.Convert(r.consumerErr).Message(), want.MessageContains):
				t.Errorf("consumer_error: %q does not name %q", refused.Error(), want.MessageContains)
			}
		default:
			t.Errorf("unknown expect key %q: this runner cannot check it", key)
		}
	}
}

// keyedCalls are the calls of entries with keyField, by its value, in the
// order they started.
func keyedCalls(calls []call, keyField string) map[string][]call {
	sorted := slices.Clone(calls)
	slices.SortStableFunc(sorted, func(a, b call) int { return a.started.Compare(b.started) })
	byKey := map[string][]call{}
	for _, c := range sorted {
		if key, ok := c.payload[keyField]; ok {
			byKey[string(key)] = append(byKey[string(key)], c)
		}
	}
	return byKey
}

// checkPerKeySerial: within a key no two calls overlap, and their seqField
// values never decrease in the order they started.
func checkPerKeySerial(t *testing.T, calls []call, keyField, seqField string) {
	t.Helper()
	byKey := keyedCalls(calls, keyField)
	if len(byKey) == 0 {
		t.Errorf("per_key_serial: no handler call had the field %q", keyField)
	}
	for key, runs := range byKey {
		seqs := make([]int, len(runs))
		for i, c := range runs {
			seqs[i], _ = strconv.Atoi(string(c.payload[seqField]))
			if i > 0 && (runs[i-1].finished.IsZero() || c.started.Before(runs[i-1].finished)) {
				t.Errorf("per_key_serial: key %q: %s started %v before %s finished", key, c.streamID, runs[i-1].finished.Sub(c.started), runs[i-1].streamID)
			}
		}
		if !slices.IsSorted(seqs) {
			t.Errorf("per_key_serial: key %q: seq in start order %v", key, seqs)
		}
	}
}

// maxConcurrentKeys is the most distinct keys with calls running at the start
// of some call.
func maxConcurrentKeys(calls []call, keyField string) int {
	most := 0
	for _, c := range calls {
		if _, ok := c.payload[keyField]; !ok || c.finished.IsZero() {
			continue
		}
		keys := map[string]bool{}
		for _, o := range calls {
			key, ok := o.payload[keyField]
			if ok && !o.finished.IsZero() && !o.started.After(c.started) && c.started.Before(o.finished) {
				keys[string(key)] = true
			}
		}
		most = max(most, len(keys))
	}
	return most
}

// eventually reads an integer from Redis until it equals want (acks the
// sidecar received are applied in its next XACK batch), for up to 5 s.
func (r *run) eventually(key string, want int64, args ...string) {
	var got int64
	begin := time.Now()
	for reads := 1; ; reads++ {
		got = redisInt(r.t, r.cl.redisAddr, args...)
		if got == want && reads > 1 {
			r.t.Logf("%s: reached after %v", key, time.Since(begin).Round(time.Millisecond))
		}
		if got == want || time.Since(begin) > 5*time.Second {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got != want {
		r.t.Errorf("%s: %s is %d, want %d", key, strings.Join(args, " "), got, want)
	}
}

// sink is the stream the ack_emit action emits to.
func (r *run) sink() string { return r.stream + ":sink" }

type sinkEntry struct {
	id     string
	fields map[string]string
}

// sinkEntries reads every entry of the sink stream.
func (r *run) sinkEntries() []sinkEntry { return r.entries(r.sink()) }

// entries reads every entry of stream.
func (r *run) entries(stream string) []sinkEntry {
	reply, err := redisDo(r.cl.redisAddr, "XRANGE", stream, "-", "+")
	if err != nil {
		r.t.Fatalf("XRANGE: %v", err)
	}
	var out []sinkEntry
	entries, _ := reply.([]any)
	for _, raw := range entries {
		entry, _ := raw.([]any)
		if len(entry) < 2 {
			continue
		}
		e := sinkEntry{fields: map[string]string{}}
		e.id, _ = entry[0].(string)
		flat, _ := entry[1].([]any)
		for i := 0; i+1 < len(flat); i += 2 {
			k, _ := flat[i].(string)
			v, _ := flat[i+1].(string)
			e.fields[k] = v
		}
		out = append(out, e)
	}
	return out
}

// deadLetterFields reads the first entry of the dead-letter stream.
func (r *run) deadLetterFields() map[string]string {
	entries := r.entries(r.stream + ":dlq")
	if len(entries) == 0 {
		return map[string]string{}
	}
	return entries[0].fields
}

func describeDiff(got, want map[string][]byte) string {
	var out []string
	for k, w := range want {
		g, ok := got[k]
		switch {
		case !ok:
			out = append(out, fmt.Sprintf("%q missing", k))
		case !bytes.Equal(g, w):
			out = append(out, fmt.Sprintf("%q: %d bytes, want %d", k, len(g), len(w)))
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			out = append(out, fmt.Sprintf("unexpected field %q", k))
		}
	}
	return strings.Join(out, "; ")
}
