// Package echomq is the Go client of the EchoMQ sidecar: a thin, idiomatic
// wrapper over the generated gRPC stubs in [echomqv1].
//
// The sidecar owns the Redis Streams consumer groups; this package opens the
// one bidirectional Consume call per subscription, asks for batched delivery
// frames, runs your [Handler] (or, opt-in, a [BatchHandler]) on a fixed pool of
// handler goroutines, answers every delivery with a verdict (acks coalesced
// into one Ack message per short window), and re-opens the call with jittered
// exponential backoff when it breaks.
//
// Besides the consumer, [Streams] appends to, reads and trims streams and
// [Admin] describes groups and lists and replays dead letters; all of them can
// share one connection from [Dial]. Settings are structs throughout
// ([ConsumerConfig] with its [FlowControl], [AppendOptions], [ReadRange],
// [TrimBound], [ReplayOptions]). The names are those of the other clients
// (clients/CONTRACT.md, "Surface"); [Producer], [NewProducer], [WithMaxLen],
// [WithPartitionKey], [WithDedupKey], [Appended], [Trimmed], [Replay],
// [MemorySeen], [MemoryVersions] and the flat MaxInFlight, Concurrency and
// MaxBatch of [ConsumerConfig] are their deprecated old names, kept for a
// release.
//
// Delivery is at-least-once: an entry may be handed to a handler more than once
// (after a Fail, a dropped call, a sidecar restart or a peer's reclaim). The
// branded id ([Delivery.ID]) is the idempotency key; [SkipSeen] and
// [NewerWins] are small handler middlewares built on it.
//
// # Layout
//
//   - dial.go: [Dial], a connection to the sidecar (TCP `host:port` or `unix:/path`).
//   - consumer.go: [Consumer] and [ConsumerConfig]: Run, Stop, the reconnect loop, the raw escape hatch.
//   - call.go: one Consume call: receive loop, the verdict sender that coalesces acks, the graceful drain.
//   - pool.go: the handler workers shared by the calls; settling by a handler's or batch handler's result.
//   - delivery.go: [Delivery] and its explicit settlement (Ack, Fail, DeadLetter, Extend).
//   - start.go: [Start], where a new group begins reading (required, no default).
//   - errors.go: [SubscriptionError], which gRPC codes are permanent, [VerdictError].
//   - backoff.go: [Backoff], the jittered exponential reconnect delay.
//   - producer.go: [Streams.Append], AppendBatch and AppendBatchEntries ([AppendOptions], dedup keys: idempotent appends); the deprecated [Producer].
//   - streams.go: [Streams]: Read (a page, or every page with [Streams.ReadAll]) and Trim.
//   - admin.go: [Admin]: DescribeGroup, and dead letters: list (a page, or [Admin.DeadLetters]) and replay.
//   - idempotency.go: [SkipSeen], [NewerWins] and their in-memory stores.
//   - echomqv1/: generated code (buf + protoc-gen-go + protoc-gen-go-grpc), never edited by hand.
package echomq
