"""The peers bench (``bench/peers.py``): the peers' installs and launchers (``install``) and
where timing-proxy stands among them (``report``); the run is ``bench/overhead``'s."""
