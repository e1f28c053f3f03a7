import socket, sys, hashlib, os, threading, time
N=int(sys.argv[1]); res={}
L=socket.socket(); L.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR,1); L.bind(('127.0.0.1',23182)); L.listen()
def sink():
    s,_=L.accept(); h=hashlib.sha256(); n=0
    s.settimeout(15)
    try:
        while True:
            b=s.recv(65536)
            if not b: break
            h.update(b); n+=len(b)
    except Exception as e: res['err']=repr(e)
    res['n']=n; res['h']=h.hexdigest()[:16]; s.close()
t=threading.Thread(target=sink); t.start()
data=os.urandom(N)
c=socket.create_connection(('127.0.0.1',23180)); c.settimeout(15)
c.sendall(b'CONNECT 127.0.0.1:23182 HTTP/1.1\r\nHost: x\r\n\r\n')
hdr=b''
while b'\r\n\r\n' not in hdr: hdr+=c.recv(1)
t0=time.time()
try:
    c.sendall(data); c.shutdown(socket.SHUT_WR)
except Exception as e: res['send_err']=repr(e)
t.join()
print(sys.argv[2], 'status', hdr.split(b'\r\n')[0].decode(), 'sent', N, 'server got', res.get('n'), 'sha ok' if res.get('h')==hashlib.sha256(data).hexdigest()[:16] else 'SHA MISMATCH', res.get('err',''), res.get('send_err',''), '%.2fs'%(time.time()-t0))
