package tcpproxy_test

import (
	"bufio"
	"fmt"
	"net"
	"time"

	"github.com/retrysafe/retrysafe/harness/tcpproxy"
)

// A server behind the proxy, a client through it, and a partition that refuses.
func Example() {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					fmt.Fprintf(c, "pong %s\n", sc.Text())
				}
			}()
		}
	}()

	p, err := tcpproxy.New(ln.Addr().String())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer p.Close()
	ask := func(msg string) string {
		c, err := net.DialTimeout("tcp", p.Addr(), time.Second)
		if err != nil {
			return "error"
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(time.Second))
		fmt.Fprintln(c, msg)
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			return "error"
		}
		return line[:len(line)-1]
	}

	fmt.Println(ask("1"))
	p.Cut()
	fmt.Println(ask("2"))
	p.Restore()
	fmt.Println(ask("3"))
	// Output:
	// pong 1
	// error
	// pong 3
}
