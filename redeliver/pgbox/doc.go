// Package pgbox is the PostgreSQL side of package redeliver: an Inbox, which makes a
// consumer idempotent, and an Outbox, which makes a producer reliable. Both keep their
// rows in the database the business writes go to, in the same transactions.
//
// # Inbox
//
// A broker delivers at least once: a consumer that dies after its work committed but
// before its ack, or whose ack is lost in a broker failover, or after a retry copy was
// confirmed but before the original's ack, gets the message again. Set the Inbox as the
// consumer's redeliver.Config.Inbox and make the handler's writes through Tx(ctx):
//
//	c, err := redeliver.New(redeliver.Config{Source: src, Inbox: inbox,
//		Handler: func(ctx context.Context, m *redeliver.Message) error {
//			_, err := pgbox.Tx(ctx).Exec(ctx, "UPDATE access SET state = 'granted' WHERE grant_id = $1", m.ID)
//			return err
//		}})
//
// Each delivery then runs in a transaction that first records the message id:
//
//	INSERT INTO retrysafe_inbox (queue, message_id, processed_at, expires_at)
//	VALUES (…) ON CONFLICT (queue, message_id) DO NOTHING
//
// One row inserted: the handler runs and both commit together. No row: the message was
// processed before, the transaction rolls back, and the Consumer acks the duplicate
// without running the handler again, and counts it
// (retrysafe_redeliver_duplicates_total). A handler error rolls back the id too, so a
// retry runs it again. Without the inbox, every failover runs some completed messages
// again (see package redeliver for the figures). Ids are scoped by queue and kept for
// InboxConfig.TTL (default 7 days); Inbox.DeleteExpired removes older ones in batches.
// Messages need ids (Message.ID, AMQP message-id, Nats-Msg-Id): one without is
// dead-lettered (ErrNoID, permanent). Inbox.Do and Inbox.Handler do the same for code
// that runs outside a Consumer, or wants the transaction as an argument (under a
// Consumer with this Inbox they join its transaction). The SQLite equivalent is
// redeliver/sqlitebox.
//
// # Outbox
//
// "State committed but message never sent" (a message that announces state already in
// PostgreSQL, such as a grant) cannot happen when the message is a row written in the same
// transaction as the state. Outbox.Add writes it; Outbox.Relay (or RelayOnce) publishes
// due rows through a redeliver.Publisher (rabbitmq.Publisher waits for each confirm),
// locking them with SELECT … FOR UPDATE SKIP LOCKED so several relays share the work
// without waiting for each other, and deletes them in the same transaction. A publish
// that fails is retried later with backoff; meanwhile later rows go ahead, so order is
// kept only among messages that publish at the first try. A relay that dies after a
// confirm and before its commit publishes those messages again, with the same ids:
// consumers deduplicate them with an Inbox.
//
// # Schema
//
// The DDL is embedded (inbox.sql, outbox.sql) and applied by Migrate, idempotently and
// under an advisory lock. Schema and table names are configurable.
package pgbox
