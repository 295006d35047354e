One NAME.conf per payment terminal, read by `pppbridge serve` (pppbridge.service): see
pppbridge.conf(5) and /usr/share/doc/pppbridge/examples/lane1.conf. Files here must be
regular files owned by root (or the service's user) and not writable by group or others.
