-- A volume's disk by every volid z9 recorded for it (resources/z9/resources/volume/guard.py): where a VM
-- holds it without its serial — a bare unusedN after an operator's unplug (PUT …/config delete=scsiN) or a
-- detach of its own cut short — the deletion guard and the volume's jobs still know it. A verify that saw
-- the disk resets the list to the volid it saw; a step that is about to move or unplug the disk adds the
-- volid it acts on, and an attach the volid the disk got on the server (pve-storage rename_volume).
ALTER TABLE volumes ADD COLUMN disk_volids text[] NOT NULL DEFAULT '{}';

UPDATE volumes SET disk_volids = ARRAY[observed->>'volid']
WHERE observed->>'volid' IS NOT NULL AND status <> 'deleted';

-- the deletion guard reads the region's live volumes that recorded a volid
CREATE INDEX volumes_region_disk_volids ON volumes (region) WHERE status <> 'deleted' AND disk_volids <> '{}';
