-- Tokens scoped to actors and with an expiry; idempotency keys kept per caller (the column is
-- added before the primary key that names it); the producers' role.
ALTER TABLE "corral"."idempotency_keys" ADD COLUMN "caller" text DEFAULT '' NOT NULL;--> statement-breakpoint
ALTER TABLE "corral"."idempotency_keys" DROP CONSTRAINT "idempotency_keys_agent_uid_session_id_key_pk";--> statement-breakpoint
ALTER TABLE "corral"."idempotency_keys" ADD CONSTRAINT "idempotency_keys_agent_uid_session_id_caller_key_pk" PRIMARY KEY("agent_uid","session_id","caller","key");--> statement-breakpoint
ALTER TABLE "corral"."api_tokens" ADD COLUMN "actors" text[];--> statement-breakpoint
ALTER TABLE "corral"."api_tokens" ADD COLUMN "expires_at" timestamp with time zone;--> statement-breakpoint
CREATE INDEX "api_tokens_expired" ON "corral"."api_tokens" USING btree ("expires_at") WHERE expires_at is not null;--> statement-breakpoint
ALTER TABLE "corral"."api_tokens" ADD CONSTRAINT "api_tokens_actors" CHECK (actors is null or cardinality(actors) between 1 and 64);--> statement-breakpoint
-- The producers' role (src/db/enqueue/send-event.ts, E8): it may call the SQL enqueue and nothing
-- else. Roles belong to the whole cluster: made once, by the first database migrated, when the
-- migrating role may make roles (else a database administrator makes it: docs/operations.md).
DO $corral_role$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'corral_producer')
     AND (SELECT rolsuper OR rolcreaterole FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN
    CREATE ROLE corral_producer NOLOGIN;
  END IF;
EXCEPTION WHEN duplicate_object OR unique_violation THEN
  -- another database of the cluster made it at the same moment
  NULL;
END
$corral_role$;
