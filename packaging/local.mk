# packaging: Debian, RPM and systemd files
