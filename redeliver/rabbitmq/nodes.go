package rabbitmq

import (
	"fmt"
	"net"
	"strconv"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"
)

// nodes are the AMQP URLs of the broker's nodes a client connects to, in the order it
// tries them. A client connected to a node that dies cannot be served by that node until
// it is back, while the other nodes of a cluster serve its queues (a quorum queue's
// leader moves to a surviving member), so a reconnect tries the node after the one that
// failed, in turn, and that one last of all.
type nodes []string

// newNodes validates url and more (either may be empty, not both) and returns them in
// order, url first. field names the configuration struct in errors.
func newNodes(field, url string, more []string) (nodes, error) {
	var urls []string
	if url != "" {
		urls = append(urls, url)
	}
	for i, u := range more {
		if u == "" {
			return nil, fmt.Errorf("%w: %s.URLs[%d] is empty", ErrConfig, field, i)
		}
		urls = append(urls, u)
	}
	if len(urls) == 0 {
		return nil, fmt.Errorf("%w: %s.URL (or URLs) is required", ErrConfig, field)
	}
	seen := map[string]bool{}
	for _, u := range urls {
		p, err := amqp.ParseURI(u)
		if err != nil {
			// The error of ParseURI may quote the URL, password included: name the
			// node by its position only.
			return nil, fmt.Errorf("%w: %s: node %d is not an AMQP URL", ErrConfig, field, len(seen)+1)
		}
		key := p.Scheme + "://" + net.JoinHostPort(p.Host, strconv.Itoa(p.Port)) + "/" + p.Vhost
		if seen[key] {
			return nil, fmt.Errorf("%w: %s names node %s twice", ErrConfig, field, hostOf(u))
		}
		seen[key] = true
	}
	return urls, nil
}

// after returns the index of the node to try after node i: the next one, wrapping
// around.
func (n nodes) after(i int) int { return (i + 1) % len(n) }

// hostOf names a node in logs and errors by the host and port of its URL, never its
// credentials.
func hostOf(url string) string {
	if p, err := amqp.ParseURI(url); err == nil {
		return net.JoinHostPort(p.Host, strconv.Itoa(p.Port))
	}
	if i := strings.LastIndex(url, "@"); i >= 0 {
		url = url[i+1:]
	}
	return strings.TrimSuffix(url, "/")
}
