"""Python requests, with urllib3's Retry on an HTTPAdapter, sending N logical POSTs to
BASE (the fault proxy in front of retrysafe gateway), each with a fixed Idempotency-Key
and its logical id (LID) in its body; one JSON line per logical request on stdout.

    python3 requests_client.py BASE N PREFIX CONCURRENCY

Retry(total=3, backoff_factor=0.1, status_forcelist=[429, 500, 502, 503, 504],
allowed_methods=None): None retries every method, POST included, on a connection or
read error and on the listed statuses (409 is not one).
"""

import json
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import requests
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

base, n, prefix = sys.argv[1], int(sys.argv[2]), sys.argv[3]
concurrency = int(sys.argv[4]) if len(sys.argv) > 4 else 1
local = threading.local()
out = threading.Lock()


def session():
    s = getattr(local, "session", None)
    if s is None:
        retry = Retry(total=3, backoff_factor=0.1, status_forcelist=[429, 500, 502, 503, 504], allowed_methods=None)
        s = requests.Session()
        s.mount("http://", HTTPAdapter(max_retries=retry))
        local.session = s
    return s


def one(i):
    lid = f"{prefix}-{i}"
    key = f"{lid}-key"
    try:
        r = session().post(base + "/v1/payments", json={"lid": lid, "amount": 100, "currency": "EUR"},
                           headers={"Idempotency-Key": key}, timeout=60)
        res = {"lid": lid, "key": key, "status": r.status_code,
               "replayed": r.headers.get("Idempotent-Replayed") == "true"}
    except requests.RequestException as e:
        res = {"lid": lid, "key": key, "status": 0, "error": type(e).__name__}
    with out:
        sys.stdout.write(json.dumps(res) + "\n")
        sys.stdout.flush()


with ThreadPoolExecutor(max_workers=concurrency) as pool:
    list(pool.map(one, range(n)))
