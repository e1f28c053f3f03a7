"""64 B request/response through a splitway relay's HTTP CONNECT listener:
an echo server, then N round trips from a client through the relay. Prints
the mean round trip in microseconds. usage: relay_rr.py RELAY_PORT ECHO_PORT N LABEL"""
import socket, sys, threading, time
relay, echo_port, n, label = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
L = socket.socket(); L.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
L.bind(('127.0.0.1', echo_port)); L.listen()
def serve():
    s, _ = L.accept(); s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while True:
        b = s.recv(64)
        if not b: break
        s.sendall(b)
    s.close()
t = threading.Thread(target=serve); t.start()
c = socket.create_connection(('127.0.0.1', relay)); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
c.sendall(b'CONNECT 127.0.0.1:%d HTTP/1.1\r\nHost: x\r\n\r\n' % echo_port)
hdr = b''
while b'\r\n\r\n' not in hdr: hdr += c.recv(1)
msg = b'x' * 64
for _ in range(200): c.sendall(msg); c.recv(64)
t0 = time.perf_counter()
for _ in range(n):
    c.sendall(msg)
    got = 0
    while got < 64: got += len(c.recv(64 - got))
el = time.perf_counter() - t0
c.close(); t.join()
print(label, 'rtt_us', round(el / n * 1e6, 2))
