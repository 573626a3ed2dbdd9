// Package redeliver runs queue consumers that retry safely: a message whose handler fails
// is not put back at the head of the queue (RabbitMQ's Nack with requeue hot-loops
// without advancing any counter) but delivered again after a backoff, with its attempt
// count in a header, up to Policy.MaxAttempts deliveries; then it is dead-lettered with
// the reason, the last error, the attempts, the first and last failure times and the
// source queue, where a person can inspect and replay it.
//
// The package is broker-neutral. Backends implement Source and Delivery:
// redeliver/rabbitmq (delay queues, publisher confirms) and redeliver/jetstream
// (NakWithDelay, a DLQ stream). Config.Inbox (redeliver/pgbox, redeliver/sqlitebox)
// makes a consumer effectively once: the duplicate a broker delivers after a failover is
// acknowledged without running twice.
//
// # Effectively once: set Config.Inbox
//
// A broker delivers at least once: it delivers again every message whose ack it did not
// get, and in a failover it always misses some — acks in flight or lost with a node,
// messages pulled ahead before the pause. Measured with 2,000 messages per run, every
// failover ran 6 to 27 completed messages a second time, and a kill -9 of the node of a
// RabbitMQ classic queue (RabbitMQ's default queue type) ran 519 and 521 of them again:
// every ack since the start. Without an inbox, each of those runs its Handler again, and
// every side effect must be idempotent by itself.
//
// Config.Inbox closes that. The Consumer runs the Handler inside Inbox.Once: in a
// database transaction that first records the message id (scoped by queue) and commits
// together with the handler's writes, which the handler makes through the transaction
// in its context (pgbox.Tx, sqlitebox.Tx). A delivery whose id is already recorded is
// acknowledged without running the Handler, logged ("duplicate of a processed message")
// and counted in retrysafe_redeliver_duplicates_total; so is a delivery beyond
// Policy.MaxAttempts whose id is recorded, which would otherwise be dead-lettered. A
// handler that fails records nothing, so its retry runs it again.
//
//	inbox, err := pgbox.NewInbox(pgbox.InboxConfig{Pool: pool}) // the handler's database
//	…
//	err = inbox.Migrate(ctx)
//	…
//	c, err := redeliver.New(redeliver.Config{
//		Source: src,
//		Inbox:  inbox,
//		Handler: func(ctx context.Context, m *redeliver.Message) error {
//			_, err := pgbox.Tx(ctx).Exec(ctx, "UPDATE access SET state = 'granted' WHERE grant_id = $1", m.ID)
//			return err
//		},
//	})
//
// The guarantee covers the writes made in that transaction, to that database. A call to
// another system from the handler (an HTTP API, an email) is outside it: a crash between
// the call and the commit repeats the call, so send it with a key derived from the
// message id (an Idempotency-Key of m.Queue + "/" + m.ID). Messages need ids (the
// publisher's message id, kept across retries and replays; pgbox's Outbox gives one to a
// message that has none): a message without one is dead-lettered, since it cannot be
// deduplicated.
//
// # The consumer loop
//
// Consumer.Run calls Source.Receive from one goroutine, at most Config.Concurrency
// deliveries outstanding, and runs the Handler on each in its own goroutine under
// Policy.Timeout. For each Delivery it computes Message.Attempt — the count header + 1
// on a Source whose retries republish with the header advanced (HeaderCounter:
// RabbitMQ), the larger of the count header + 1 and Message.FailedAttempts + 1 on a
// Source that records failed attempts itself (AttemptKeeper: JetStream), else the
// larger of the count header + 1 and the broker's own delivery count (AttemptOf) —
// fills Message.FirstFailure from HeaderFirstFailure
// when the Source left it zero, and then settles it exactly once:
//
//   - with Config.Inbox, the message id is already recorded: Delivery.Ack without
//     running the handler (a duplicate);
//   - the handler returned nil: Delivery.Ack;
//   - it failed with a retryable Class (transient, timeout, panic, or a caller's own) and
//     Attempt < MaxAttempts: Delivery.Retry with RetryInfo{Delay: Policy.Delay(…),
//     Attempt, FirstFailure (the message's, or now on a first failure), Header: {count
//     header: Attempt, HeaderFirstFailure: FirstFailure}};
//   - it failed with ClassPermanent or ClassDecode, or on the last attempt:
//     Delivery.DeadLetter with a DeadInfo (ReasonPermanent, ReasonDecode,
//     ReasonMaxAttempts);
//   - on a HeaderCounter or AttemptKeeper Source, the message arrived with a broker delivery count above
//     Policy.MaxDeliveries (its handler crashes the process or never returns):
//     DeadLetter with ReasonMaxDeliver and ClassUnknown, without running the handler,
//     unless Config.Inbox has its id recorded (then it is a duplicate, acknowledged);
//   - the message arrived with Attempt > MaxAttempts (the header says its attempts are
//     spent; elsewhere the broker counted deliveries whose process crashed before it
//     could settle them): DeadLetter without running the handler, unless Config.Inbox
//     has its id recorded (then it is a duplicate, acknowledged);
//   - the shutdown grace ended the handler: Delivery.Release.
//
// # Attempt and first failure
//
// A handler reads the attempt number in Message.Attempt and the time the message's
// first attempt failed in Message.FirstFailure (zero on attempt 1). Both mean the same
// on every backend, which the headers do not: RabbitMQ republishes each retry with the
// count header advanced and HeaderFirstFailure set, while JetStream redelivers the
// stored message unchanged (its count header stays what the producer set; the backend
// keeps the failed attempts and the first failure in a key-value bucket).
//
// An attempt counts when a handler ran and reported its failure, not when a broker
// redelivered a message. Where the retry republishes the message (RabbitMQ), the count
// header is advanced only by that report, while the broker's delivery count (a quorum
// queue's x-delivery-count) rises on every redelivery of an unsettled message: a broker
// restart or a lost connection advances it for every delivery in flight, the
// prefetched ones no handler saw included. Counted as attempts, it dead-letters
// messages that never ran: five restarts of a node in 21 s, with a 3 s handler,
// dead-letter about a third of the messages early, half of those never run. So there
// the header alone counts attempts, and the delivery count only guards against a message whose handler kills its process (no
// failure is ever reported for it) with a much higher bound, Policy.MaxDeliveries
// (default 4×MaxAttempts, at least 20): such a message costs that many crashes before
// it is dead-lettered, and a run that died with its process is not among the attempts
// the header reports. JetStream redelivers the stored message unchanged, and its
// delivery count has the same flaw and one more (it goes back to 1 when a server loses
// the consumer's state), so there the Source records the failed attempts itself
// (AttemptKeeper, Message.FailedAttempts) and the delivery count is bounded the same
// way.
//
// An attempt that failed while the broker was away — its Retry or DeadLetter did not
// reach the broker, which then redelivers the message with its header unchanged — is
// remembered by the Consumer (by queue and message id, up to 10,000 messages): when the
// message comes back to the same Consumer, that attempt counts and its failure time is
// the first failure. A message without an id, or one that comes back to another
// process, loses that attempt from its count.
//
// A settlement that fails (connection lost) is logged and counted; the broker then
// redelivers the unacknowledged message, so delivery is at-least-once. Config.Inbox
// makes the handling effectively once.
//
// When Run's context ends it stops calling Receive, waits up to Config.ShutdownGrace for
// running handlers (their contexts stay alive meanwhile), cancels the stragglers and
// releases their messages, then calls Source.Close, which hands prefetched deliveries
// back to the broker.
//
// # Classification
//
// DefaultClassify sends errors matching ErrDecode (see Decode, DecodeJSON) and errors
// that retry.Retryable rejects — retry.Permanent(err), retry.ErrAuth, retry.ErrInvalid,
// retry.ErrNotFound — straight to the dead-letter queue: a 401 loop must not fill the
// DLQ only after five tries of each message. Everything else is retried. An error that
// carries a wait (retry.After, a *retry.StatusError from a 429 with Retry-After) is
// retried after that wait instead of the backoff.
//
// # Implementing a backend
//
// A backend provides a Source for one queue and, for the dlq command, DeadLetters and a
// Publisher. The contract, method by method:
//
//   - Source.Receive returns the next Delivery. It blocks until one arrives or ctx ends,
//     and reconnects by itself (with backoff) when the broker goes away, so a broker
//     restart is invisible to the Consumer except as a pause. It returns a non-context
//     error only when the Source is finished for good (ErrClosed after Close).
//   - Delivery.Message fills ID (kept across retries and replays; Inbox keys on it),
//     Queue, Body, ContentType, Header (strings; numbers in decimal; never nil),
//     DeliveryCount (the broker's count, first delivery = 1, or 0 when it keeps none),
//     Published (the first publish, kept across retries) and Received when known, and
//     FirstFailure where the backend keeps it apart from the headers. It leaves Attempt
//     to the Consumer.
//   - Delivery.Retry must never sleep while holding the delivery. Either publish a copy
//     carrying RetryInfo.Header that becomes visible after RetryInfo.Delay, wait for the
//     broker's confirm and only then ack the original (RabbitMQ), or ask the broker to
//     redeliver the original after the delay (JetStream NakWithDelay) — then the header
//     cannot change: DeliveryCount must carry the attempt count instead, and the
//     backend must keep RetryInfo.FirstFailure itself and return it as
//     Message.FirstFailure on the next deliveries. A backend may round the delay to a
//     bounded set of values.
//   - Delivery.DeadLetter publishes the body and every header, plus DeadInfo.Header(),
//     to the dead-letter queue (RabbitMQ: "<queue>.dlq"; JetStream: a DLQ stream,
//     deduplicated by message id), waits for the confirm, then acks (JetStream: Term)
//     the original. A crash between the two leaves a duplicate in the DLQ at worst,
//     never a loss.
//   - Delivery.Release hands the message back for immediate redelivery (Nack with
//     requeue; Nak).
//   - Delivery.InProgress extends the broker's ack deadline where it has one. The
//     Consumer calls it every Config.Heartbeat, or every Heartbeater.Heartbeat() when
//     the Source implements Heartbeater.
//   - Source.Close stops new deliveries and returns the prefetched ones; deliveries
//     already handed out must stay settleable until Close's context ends.
//   - Publisher.Publish returns nil only for a message the broker stored, and an error
//     matching ErrDuplicate when the broker dropped it as a duplicate of an id it
//     stored within its deduplication window.
//   - DeadLetters report each dead letter's first publish (Message.Published) and its
//     move to the DLQ (DeadLetter.DeadLettered); Replay starts each message clean:
//     none of the count, retry, dead-letter or broker dead-lettering headers of its
//     first life, so its next delivery is attempt 1 with no first failure.
//
// Every operation takes a context first and returns errors wrapped with %w. The
// conformance suite redeliver/redelivertest checks these rules; every backend runs it
// against its real broker.
//
// # Headers
//
// The attempt count travels in Policy.Header, by default "x-retry-count": the number of
// failed attempts so far, so a fresh message has none and its first retry carries 1.
// A backend whose retries republish the message advances it (RabbitMQ); one whose
// broker redelivers the stored message reads it but never rewrites it (JetStream), so
// handlers read Message.Attempt rather than the header.
// RabbitMQ reserves the "x-" prefix for its own headers and arguments (x-death,
// x-delivery-count …), and a future version may claim a name it does not use today; the
// default keeps "x-retry-count" anyway because it is the name many consumers written
// against RabbitMQ already read and write, so a redeliver consumer
// can join a queue they share. RabbitMQ itself does not interpret it (see
// redeliver/rabbitmq for the details per version). To use
// another name (say "retry-count"), set Policy.Header on every consumer of the queue
// (and the Header of the backend's DeadLetters, so a replay resets the right one);
// a consumer looking for the other name would see every message as a first attempt.
// The headers this package adds itself (HeaderReason … HeaderQueue) avoid the prefix.
//
// # Metrics
//
// With Config.Registerer set, a Consumer registers retrysafe_redeliver_received_total,
// _succeeded_total, _retried_total and _dead_lettered_total (by queue and error_class),
// _released_total, _duplicates_total (deliveries of ids the inbox had recorded),
// _settle_errors_total (by queue and op) and _handler_duration_seconds. Nothing is ever
// registered on the global registry.
package redeliver
