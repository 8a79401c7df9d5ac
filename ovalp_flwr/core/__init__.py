"""The math of a run, no Flower: heads, the trained model, local training, normalisation, the heads' starts, devices and durable writes."""
