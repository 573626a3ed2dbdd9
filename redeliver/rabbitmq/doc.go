// Package rabbitmq is the RabbitMQ backend of package redeliver, on
// github.com/rabbitmq/amqp091-go: a Source for redeliver.Consumer, a confirming
// Publisher (for redeliver's Outbox and for producers), and DeadLetters (the operations
// behind "retrysafe dlq").
//
// # Topology
//
// For a work queue Q the Source declares, idempotently on every (re)connect:
//
//	Q                  the work queue (durable; quorum, or classic: see "Queue type")
//	Q.dlq              the dead-letter queue
//	Q.delay.<ms>ms     one delay queue per bucket of Config.Delays, with
//	                   x-message-ttl = the bucket and
//	                   x-dead-letter-exchange "" / x-dead-letter-routing-key Q
//
// That is len(Config.Delays)+2 queues per work queue: 13 with the default buckets
// (DefaultDelays: 1s, 2s, 5s, 10s, 30s, 1m, 2m, 5m, 10m, 30m, 1h). Config.Topology
// lists them. Config.Delays sets other buckets: in strictly ascending order, each a
// positive whole number of milliseconds (NewSource refuses any other list, rather than
// sort or merge it, since the buckets name queues every consumer must agree on).
//
// A retry publishes a copy of the message to the delay queue whose TTL is nearest the
// policy's delay on a log scale (Topology.Bucket): between buckets lo < hi, lo when the
// delay is below √(lo·hi), else hi; the shortest bucket for shorter delays, the longest
// for longer ones. So with the default buckets a 3s backoff waits 2s, a 4s one 5s, and
// nothing waits more than an hour. When the TTL expires RabbitMQ dead-letters the copy
// back to Q. Every message in a delay queue has the same TTL, so they expire in order
// from the head — per-message TTLs in one queue would not work, since RabbitMQ only
// expires messages at the head of a queue. Rounding to a bounded set of buckets keeps
// the number of queues fixed whatever the backoff produces; full jitter still spreads
// retries across the buckets. Dead-lettering from a classic delay queue is
// at-most-once inside the broker (a node crash at the wrong moment can drop the copy);
// with quorum queues (the default) the delay queues dead-letter with
// x-dead-letter-strategy=at-least-once.
//
// # Queue type
//
// The Source declares quorum queues unless Config.Classic asks for classic ones. A
// queue's type cannot change in place (RabbitMQ refuses a redeclare with another
// x-queue-type), so when the work queue already exists as a classic queue the Source
// keeps it — the whole topology classic — and logs a warning; Config.Quorum makes that
// an error instead. Whenever the queues are classic, NewSource logs at start what they
// lose on a node crash:
//
//   - acknowledgements: a classic queue writes its acks to disk lazily, so after a
//     kill -9 of its node it redelivers messages already acknowledged — in a test,
//     every ack since the node started (about 520 of 2,000 completed messages ran
//     again; a quorum queue redelivers only the acks in flight);
//   - retry copies: dead-lettering from a classic delay queue back to the work queue is
//     at most once, so a crash can drop a copy waiting there;
//   - the delivery count: none is kept, so a message that crashes every consumer that
//     takes it is redelivered without end (redeliver.Policy.MaxDeliveries cannot act);
//   - replication: a classic queue lives on one node, gone while that node is.
//
// To move to quorum queues, stop the consumers, drain the work and delay queues, delete
// the topology (DeleteTopology; the DLQ too, once replayed or saved) and start a Source
// without Config.Classic.
//
// # Settling a delivery
//
// The Source consumes with manual acks and a prefetch (Config.Prefetch). It never sleeps
// holding a delivery:
//
//   - success: basic.ack;
//   - retry: publish the copy (same body, properties and message id; the count header
//     set as an integer; redeliver-first-failure set) to the delay queue on a channel
//     in confirm mode, mandatory; wait for the broker's confirm; only then ack the
//     original. If the process dies between the two, the broker redelivers the
//     original as well: a duplicate, never a loss (redeliver/pgbox's Inbox absorbs
//     it);
//   - dead letter: publish the copy with the dead-letter headers and
//     HeaderDeadLettered (the time of the move: RabbitMQ records none of its own) to
//     Q.dlq, confirmed, then ack;
//   - a publish that fails or is not confirmed nacks the original with requeue, so the
//     broker delivers it again;
//   - shutdown: unsettled and prefetched deliveries return to the queue when the
//     connection closes.
//
// Copies are persistent and drop the original's expiration (which would cut the delay
// short) and user-id (which must match the republishing connection's user).
//
// # Attempt count
//
// Message.Attempt is the count header + 1: every retry republishes the message with the
// header advanced, and nothing else advances it, so it counts the attempts a handler
// ran and reported failed — a redelivery spends none (Source implements
// redeliver.HeaderCounter). Message.FirstFailure comes from the redeliver-first-failure
// header every retry copy carries.
//
// A quorum queue's x-delivery-count (Message.DeliveryCount - 1) is not an attempt
// count: a broker restart, a failover or a lost connection hands back every unsettled
// delivery with the count advanced, those prefetched and never handed to a handler
// included, and three restarts while slow handlers worked would have dead-lettered a
// third of the messages with fewer handler runs than MaxAttempts, many never run. It
// serves only as the guard against a poison message that crashes the consumer before
// any republish: a delivery whose count exceeds redeliver.Policy.MaxDeliveries
// (default 4×MaxAttempts, at least 20) is dead-lettered without running the handler,
// reason "max-deliver", class "unknown", its attempts the failures the header records.
// Classic queues keep no count (only the redelivered flag), so a message that kills
// every consumer that takes it is redelivered without end there: use quorum queues.
//
// The header is named x-retry-count by default although RabbitMQ reserves the "x-"
// prefix for itself (x-death, x-delivery-count, x-first-death-*): the name is the
// convention many existing RabbitMQ consumers already use, so
// a redeliver consumer interoperates with them on a shared queue. RabbitMQ does not
// interpret it (checked on 3.10; RabbitMQ 4 keeps x- headers of AMQP 0-9-1 messages as
// AMQP 1.0 message annotations internally and returns them to AMQP 0-9-1 consumers as
// headers — an AMQP 1.0 consumer finds it among the message annotations instead of the
// application properties). To avoid the prefix, set redeliver.Policy.Header (for
// example to "retry-count") on every consumer of the queue, and DeadLettersConfig.Header
// to the same name so that a replay resets it. The headers redeliver adds itself
// (redeliver-reason, redeliver-error …) do not use the prefix.
//
// # Replaying
//
// DeadLetters.Replay publishes a dead letter back to Q as a fresh message: body,
// properties and message id kept (the timestamp property too, so Message.Published
// stays the first publish), and every header of its last life removed — the count
// header, the redeliver-* headers, and RabbitMQ's own x-death, x-first-death-* and
// x-last-death-*, which record its passes through the delay queues. Its next delivery
// is attempt 1 with no first failure, as on any backend.
//
// # Reconnecting
//
// When the connection or the consume channel closes (broker restart, network failure,
// a forced close), Receive reconnects with Config.Reconnect's backoff (full jitter,
// 100ms to 5s) until it succeeds or its context ends, re-declares the topology and
// consumes again. Deliveries from the old connection can no longer be settled (their
// acks fail; the Consumer logs and counts them) and the broker redelivers them.
//
// # Clusters
//
// On a RabbitMQ cluster, give the Source every node: Config.URL and Config.URLs (the
// Publisher likewise, PublisherConfig.URLs). A reconnect tries the nodes in turn,
// starting with the one after the node it lost and ending with that node, and waits
// the Reconnect backoff only after a round in which none answered; it logs the node it
// connected to ("rabbitmq: connected", node=host:port). With URL alone a consumer whose
// node died waits for that node to come back, although the surviving nodes serve its
// quorum queues. Measured on a disposable 3-node cluster of RabbitMQ 3.10 (TestCluster,
// under -race on a shared 2-core machine, four runs), a consumer of 4 handlers with the
// default settings and an inbox, 300 messages per fault, every fifth failing its first
// run:
//
//   - kill -9 of the node leading the queues (the consumer on another node): handling
//     went on 54–130 ms after the kill, the consumer keeping its connection;
//   - kill -9 of the consumer's node: it reconnected to the next node and handling
//     resumed 56–500 ms after the kill; with URL alone nothing was handled for the
//     90 s the test waited with the node down;
//   - two clean stops of the consumer's node against 500 ms handlers: resumed
//     0.55–1.5 s after each stop;
//
// with no message lost, none dead-lettered, and no effect applied twice with the inbox;
// without it 0–1, 3–5 and 6–7 effects of the 300, 300 and 200 messages were applied
// twice (acks lost with the node). Quorum queues survive the loss of a minority of their
// nodes: on three nodes, one at a time.
//
// One broker setting matters after a kill -9 of the node leading the work queue. A
// retry copy leaves its delay queue through the quorum queue's at-least-once
// dead-letter worker, which republishes it to the work queue and waits for the
// confirm; a copy republished towards the dead leader is sent again only after
// dead_letter_worker_publisher_confirm_timeout, 3 minutes by default. In the test the
// copies in the delay queues then came back 2 min 53 s after the node's restart, the
// last 6 minutes after the kill. Set it lower in advanced.config, for example
//
//	[{rabbit, [{dead_letter_worker_publisher_confirm_timeout, 5000}]}].
//
// and they came back within 4 s of the kill. Nothing is lost either way (the copies stay
// in the delay queue until confirmed), but the retries wait that long.
//
// # Publishing
//
// Every publish — retry copies, dead letters, replays, Publisher.Publish — goes to the
// default exchange with the queue as routing key, mandatory, and waits for the
// publisher confirm; a message returned as unroutable (the queue was deleted) fails with
// ErrUnroutable instead of vanishing, and a nack with ErrNacked. RabbitMQ never
// deduplicates: every confirmed publish is stored, one with an id already in the queue
// included, so Publisher.Publish never returns redeliver.ErrDuplicate, and consumers
// absorb duplicates with an inbox (redeliver/pgbox, redeliver/sqlitebox).
package rabbitmq
