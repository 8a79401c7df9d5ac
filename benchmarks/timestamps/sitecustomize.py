"""Put on PYTHONPATH, turns on Flower's log timestamps in every Python process started with it
(flower_overhead.py's deployment run: the SuperNodes' logs, read by `ops.timings.node_timeline`)."""

try:
    from flwr.supercore.logger import update_console_handler
except ImportError:  # a process without Flower
    pass
else:
    update_console_handler(timestamps=True, colored=False)
