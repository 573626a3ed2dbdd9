// Package oncetest proves redeliver.Config.Inbox across a broken link: its tests run a
// Consumer against the real RabbitMQ and NATS JetStream through a TCP proxy, partition
// the link after a handler's transaction committed and before its ack reached the
// broker, so that the broker delivers the message again, and count the side effects in
// PostgreSQL (pgbox) and SQLite (sqlitebox). The package has no code of its own.
package oncetest
