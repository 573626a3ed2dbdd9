package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/retrysafe/retrysafe/redeliver"
)

// Errors of a confirmed publish.
var (
	// ErrNacked: the broker refused to take responsibility for a message (basic.nack),
	// or the channel closed before it confirmed it; whether it was stored is unknown.
	ErrNacked = errors.New("rabbitmq: publish not confirmed")
	// ErrUnroutable: the message was returned because no queue is bound to its routing
	// key (the queue was deleted).
	ErrUnroutable = errors.New("rabbitmq: message unroutable")
)

// confirmChannel is a channel in confirm mode on which every publish is mandatory and
// waits for its confirm. It is safe for concurrent use.
type confirmChannel struct {
	ch      *amqp.Channel
	returns chan amqp.Return // buffered: the reader hands a return over before the confirm

	mu       sync.Mutex
	returned map[returnKey]int
}

type returnKey struct{ key, id string }

// returnBuffer is the capacity of the returns channel. amqp091 gives up handing a return
// to a full listener after a timeout, so it can never block the connection for good.
const returnBuffer = 256

func newConfirmChannel(conn *amqp.Connection) (*confirmChannel, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("rabbitmq: opening publish channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		_ = ch.Close()
		return nil, fmt.Errorf("rabbitmq: enabling publisher confirms: %w", err)
	}
	c := &confirmChannel{ch: ch, returns: make(chan amqp.Return, returnBuffer), returned: map[returnKey]int{}}
	ch.NotifyReturn(c.returns)
	return c, nil
}

// drainLocked moves the returns received so far into c.returned.
func (c *confirmChannel) drainLocked() {
	for {
		select {
		case r, ok := <-c.returns:
			if !ok {
				return
			}
			c.returned[returnKey{r.RoutingKey, r.MessageId}]++
		default:
			return
		}
	}
}

// publish sends msg to the default exchange with routing key key, mandatory, and waits
// for the confirm. The broker hands a return over before the confirm of the same
// message, and amqp091 passes it to the buffered returns channel before it processes the
// confirm, so after the confirm the return (if any) is in the channel or already drained.
func (c *confirmChannel) publish(ctx context.Context, key string, msg amqp.Publishing) error {
	c.mu.Lock()
	c.drainLocked() // keep the buffer short
	c.mu.Unlock()
	dc, err := c.ch.PublishWithDeferredConfirmWithContext(ctx, "", key, true, false, msg)
	if err != nil {
		return fmt.Errorf("rabbitmq: publishing to %q: %w", key, err)
	}
	ok, err := dc.WaitContext(ctx)
	if err != nil {
		return fmt.Errorf("rabbitmq: waiting for the confirm of a publish to %q: %w", key, err)
	}
	if !ok {
		return fmt.Errorf("rabbitmq: publishing to %q: %w", key, ErrNacked)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.drainLocked()
	k := returnKey{key, msg.MessageId}
	if n := c.returned[k]; n > 0 {
		if n == 1 {
			delete(c.returned, k)
		} else {
			c.returned[k] = n - 1
		}
		return fmt.Errorf("rabbitmq: publishing to %q: %w", key, ErrUnroutable)
	}
	return nil
}

func (c *confirmChannel) close() error { return c.ch.Close() }

// copyOf returns a publishing that carries d's body, properties and headers, with the
// headers in set added (countHeader written as an integer, the others as strings), the
// broker's own x-delivery-count dropped, the CC and BCC headers dropped (RabbitMQ
// routes a publish to their routing keys too: the copy must reach only its queue),
// persistent delivery, and no user-id or expiration (a user-id must match the
// republishing connection's user; an expiration would cut the delay short).
func copyOf(d *amqp.Delivery, set map[string]string, countHeader string) amqp.Publishing {
	h := amqp.Table{}
	maps.Copy(h, d.Headers)
	delete(h, headerDeliveryCount)
	delete(h, "CC")
	delete(h, "BCC")
	for k, v := range set {
		if k == countHeader {
			if n, err := strconv.ParseInt(v, 10, 64); err == nil {
				h[k] = n
				continue
			}
		}
		h[k] = v
	}
	return amqp.Publishing{
		Headers:         h,
		ContentType:     d.ContentType,
		ContentEncoding: d.ContentEncoding,
		DeliveryMode:    amqp.Persistent,
		Priority:        d.Priority,
		CorrelationId:   d.CorrelationId,
		ReplyTo:         d.ReplyTo,
		MessageId:       d.MessageId,
		Timestamp:       d.Timestamp,
		Type:            d.Type,
		AppId:           d.AppId,
		Body:            d.Body,
	}
}

// headerDeliveryCount is the header in which quorum queues count earlier deliveries.
const headerDeliveryCount = "x-delivery-count"

// HeaderDeadLettered is when a dead letter was moved to the DLQ (RFC 3339 with
// nanoseconds, UTC, by the dead-lettering consumer's clock), which DeadLetter.DeadLettered
// reports: RabbitMQ keeps no time of its own for a publish. Like the other dead-letter
// headers, a replay removes it.
const HeaderDeadLettered = "redeliver-dead-lettered"

// replayDrops reports whether a replay removes header k (countHeader is the attempt
// count header). A replay starts the message's life again, so it removes what records
// the last one: the count header and the headers package redeliver adds (the attempt
// count would resume, the first failure would be the old one), HeaderDeadLettered, and
// RabbitMQ's own records of dead-lettering through the delay queues (x-death,
// x-first-death-*, x-last-death-*), which would say the fresh message had already
// expired from a delay queue.
func replayDrops(k, countHeader string) bool {
	return k == countHeader || k == HeaderDeadLettered || redeliver.IsRedeliverHeader(k) ||
		k == "x-death" || strings.HasPrefix(k, "x-first-death-") || strings.HasPrefix(k, "x-last-death-")
}

// toMessage converts a delivery from queue. DeliveryCount is x-delivery-count + 1 when
// the header is there, 1 on a quorum queue without it, 0 otherwise.
func toMessage(d *amqp.Delivery, queue string, quorum bool, now time.Time) *redeliver.Message {
	m := &redeliver.Message{
		ID:          d.MessageId,
		Queue:       queue,
		Body:        d.Body,
		ContentType: d.ContentType,
		Header:      stringHeaders(d.Headers),
		Published:   d.Timestamp,
		Received:    now,
	}
	if n, ok := intValue(d.Headers[headerDeliveryCount]); ok && n >= 0 && n < 1<<30 {
		m.DeliveryCount = int(n) + 1
	} else if quorum {
		m.DeliveryCount = 1
	}
	return m
}

// stringHeaders converts the scalar AMQP headers to strings (numbers in decimal, times in
// RFC 3339); tables and arrays (x-death) are left out.
func stringHeaders(t amqp.Table) map[string]string {
	h := make(map[string]string, len(t))
	for k, v := range t {
		if s, ok := stringValue(v); ok {
			h[k] = s
		}
	}
	return h
}

func stringValue(v any) (string, bool) {
	switch v := v.(type) {
	case string:
		return v, true
	case []byte:
		return string(v), true
	case bool:
		return strconv.FormatBool(v), true
	case float32:
		return strconv.FormatFloat(float64(v), 'g', -1, 32), true
	case float64:
		return strconv.FormatFloat(v, 'g', -1, 64), true
	case time.Time:
		return v.UTC().Format(time.RFC3339), true
	case amqp.Decimal:
		return strconv.FormatInt(int64(v.Value), 10) + "e-" + strconv.Itoa(int(v.Scale)), true
	}
	if n, ok := intValue(v); ok {
		return strconv.FormatInt(n, 10), true
	}
	return "", false
}

func intValue(v any) (int64, bool) {
	switch v := v.(type) {
	case int:
		return int64(v), true
	case int8:
		return int64(v), true
	case int16:
		return int64(v), true
	case int32:
		return int64(v), true
	case int64:
		return v, true
	case uint8:
		return int64(v), true
	case uint16:
		return int64(v), true
	case uint32:
		return int64(v), true
	case uint64:
		if v > 1<<62 {
			return 0, false
		}
		return int64(v), true
	}
	return 0, false
}

// publishingOf converts an outgoing message: id, body, content type, headers (all
// strings), persistent.
func publishingOf(m *redeliver.Message, now time.Time) amqp.Publishing {
	h := amqp.Table{}
	for k, v := range m.Header {
		h[k] = v
	}
	return amqp.Publishing{
		Headers:      h,
		ContentType:  m.ContentType,
		DeliveryMode: amqp.Persistent,
		MessageId:    m.ID,
		Timestamp:    now,
		Body:         m.Body,
	}
}
