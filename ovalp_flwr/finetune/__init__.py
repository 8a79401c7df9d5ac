"""Federated fine-tuning through the encoder, on raw data: the baselines OvA-LP's claim is
measured against (README, "Fine-tuning the encoder").

`finetune` in the run config picks the method, one small unit each:
- `lp` (lp.py): the heads on the frozen encoder's features, computed every step;
- `fedavg-lora` (lora.py): peft's LoRA on the encoder, A and B averaged apart;
- `flora` (flora.py): LoRA modules stacked, merged into every node's encoder each round;
- `full` (full.py): every encoder parameter trains, FedAvg.
The model (model.py) and the clients' raw rows (data.py) are shared; client.py and
server.py are the Flower side; methods.py picks one by name, options.py holds its run-config
knobs. Importing this package imports nothing (so the config reads options.py without torch).
"""
