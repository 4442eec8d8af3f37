"""Outbound notifications: a team's subscriptions to job events (`events.py` builds what is
said, `formats.py` how it is sent, `services.py` when and with which retries), sent through
`adaptation.outbound_http`. The admin for them is `admin.py`."""
