"""Run by tests/test_dev_up.py: children started with a preexec_fn (so by fork, not vfork) while this
process's gRPC client is busy; prints each child's exit code."""

import subprocess
import sys
import threading
from concurrent import futures

import raftkv  # noqa: F401  first, as in every raftkv process: it sets how gRPC treats a fork

import grpc
from raftkv.dev.local_cluster import die_with_parent

server = grpc.server(futures.ThreadPoolExecutor(4))
server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
    "probe.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(lambda request, context: request)}),))
port = server.add_insecure_port("127.0.0.1:0")
server.start()
channel = grpc.insecure_channel(f"127.0.0.1:{port}")
echo = channel.unary_unary("/probe.Echo/Echo")
stop = threading.Event()

def busy():
    while not stop.is_set():
        echo(b"x", timeout=5)

threads = [threading.Thread(target=busy) for _ in range(3)]
for t in threads:
    t.start()
codes = [subprocess.run([sys.executable, "-c", "pass"], preexec_fn=die_with_parent()).returncode
         for _ in range(int(sys.argv[1]))]
stop.set()
for t in threads:
    t.join()
print(" ".join(map(str, codes)))
