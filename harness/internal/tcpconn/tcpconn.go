// Package tcpconn is how the fault-injecting proxies (faultproxy, tcpproxy) end the
// connections they hold: the two ways a peer sees a TCP connection end, written once.
package tcpconn

import "net"

// Reset closes c with an RST instead of a FIN: SO_LINGER 0 discards unsent data, and
// the peer's next read or write fails with "connection reset".
func Reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

// CloseWrite sends a FIN on c and keeps it open for reading, so the peer reads the end
// of the stream while its answer can still arrive. A connection that is not TCP is
// closed.
func CloseWrite(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
		return
	}
	_ = c.Close()
}
