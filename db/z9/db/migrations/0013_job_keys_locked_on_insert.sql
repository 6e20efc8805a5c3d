-- z9 schema, version 13: per-resource order across concurrent inserts (break14).
--
-- A job's seq came from the column default, drawn before its BEFORE INSERT trigger took the job's
-- key locks, and those locks were shared: two transactions enqueuing jobs of one lock key (an API
-- action on server S, and POST /v1/addresses assigning an address to S — whose job holds S as an
-- extra key and locks no server row — or the reaper's final job beside an API action) could
-- commit in the other order than their seqs. The later seq, committed first, was claimable (the
-- earlier job was not visible yet); once the earlier one committed it was claimable too (no
-- earlier live job holds its key), and both ran at once on the same resource.
-- Now the insert takes its keys' advisory locks exclusively (held to commit, as an end does) and
-- draws its seq after them: per key, seq order is commit order, so an earlier live job of a key
-- is always visible to a later job's trigger and to every claim. Inserts of different keys do
-- not wait on each other; inserts of one key wait for the earlier one's commit.
CREATE OR REPLACE FUNCTION jobs_block_on_insert() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    k text;
BEGIN
    -- Exclusive, to commit: two transactions enqueuing jobs of one key take their turns.
    FOR k IN SELECT DISTINCT u FROM unnest(NEW.extra_lock_keys || NEW.resource_id) AS u ORDER BY u LOOP
        PERFORM pg_advisory_xact_lock(hashtextextended('z9-lock-key:' || k, 0));
    END LOOP;
    -- The job's place in line is taken now, holding its keys (the column default's value was
    -- drawn before): per key, seq order is commit order.
    NEW.seq := nextval(pg_get_serial_sequence('jobs', 'seq'));
    -- A new statement: its snapshot is taken after the locks (READ COMMITTED).
    SELECT jobs_key_held(NEW.resource_id, NEW.extra_lock_keys, NEW.seq) INTO NEW.blocked;
    RETURN NEW;
END
$$;
