"""Backups in object storage: the layout, manifests and retention (store), below the node layer so a
node can seed a new replica from one."""
