CREATE TABLE "corral"."shard_identity" (
	"one" boolean PRIMARY KEY DEFAULT true NOT NULL,
	"shard" integer NOT NULL,
	"shard_count" integer NOT NULL,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL,
	CONSTRAINT "shard_identity_one" CHECK ("corral"."shard_identity"."one"),
	CONSTRAINT "shard_identity_count" CHECK ("corral"."shard_identity"."shard_count" between 1 and 1024),
	CONSTRAINT "shard_identity_shard" CHECK ("corral"."shard_identity"."shard" >= 0 and "corral"."shard_identity"."shard" < "corral"."shard_identity"."shard_count")
);
--> statement-breakpoint
CREATE TABLE "corral"."shards" (
	"shard" integer PRIMARY KEY NOT NULL,
	"url" text,
	"updated_at" timestamp with time zone DEFAULT now() NOT NULL,
	CONSTRAINT "shards_shard" CHECK ("corral"."shards"."shard" between 0 and 1023),
	CONSTRAINT "shards_url" CHECK (url is null or char_length(url) between 1 and 2048)
);
--> statement-breakpoint
-- S1 of src/base/shard-map.ts: uint32 of the first 4 bytes of SHA-256('<agent_uid>/<session_id>'), mod shard_count
CREATE FUNCTION "corral"."shard_of"(agent_uid text, session_id text, shard_count integer) RETURNS integer
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $shard_of$
BEGIN
  IF shard_count < 1 OR shard_count > 1024 THEN
    RAISE EXCEPTION 'invalid shard count %: expected 1 to 1024', shard_count USING ERRCODE = '22023';
  END IF;
  RETURN (('x' || substr(encode(pg_catalog.sha256(convert_to(agent_uid || '/' || session_id, 'UTF8')), 'hex'), 1, 8))::bit(32)::bigint
          % shard_count)::integer;
END
$shard_of$;
