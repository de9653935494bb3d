package testenv

import (
	"net"
	"sync"
)

// CutListener makes a broker's listener whose accepted connections a test
// can close all at once: pass its Listen as kfake.ListenFn. kfake advertises
// its own address, so a proxy in front of it (NewProxy) would only see the
// bootstrap connection; cutting here cuts every client, as a network fault
// between the workers and the broker does.
type CutListener struct {
	mu    sync.Mutex
	conns map[net.Conn]struct{}
}

type trackedListener struct {
	net.Listener
	c *CutListener
}

// Listen listens on address and tracks every connection it accepts.
func (l *CutListener) Listen(network, address string) (net.Listener, error) {
	ln, err := net.Listen(network, address)
	if err != nil {
		return nil, err
	}
	return &trackedListener{Listener: ln, c: l}, nil
}

func (l *trackedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.c.mu.Lock()
	if l.c.conns == nil {
		l.c.conns = map[net.Conn]struct{}{}
	}
	l.c.conns[c] = struct{}{}
	l.c.mu.Unlock()
	return c, nil
}

// Cut closes every connection accepted so far; the listener keeps
// accepting, so clients reconnect.
func (l *CutListener) Cut() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for c := range l.conns {
		_ = c.Close()
	}
	l.conns = nil
}
