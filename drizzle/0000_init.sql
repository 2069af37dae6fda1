CREATE SCHEMA "corral";
--> statement-breakpoint
CREATE TABLE "corral"."activations" (
	"activation_uid" uuid PRIMARY KEY NOT NULL,
	"agent_uid" text NOT NULL,
	"session_id" text NOT NULL,
	"actor_epoch" bigint NOT NULL,
	"lease_id" uuid NOT NULL,
	"lease_expires_at" timestamp with time zone NOT NULL,
	"owner_id" text NOT NULL,
	"current_event_id" uuid,
	"revision" integer DEFAULT 0 NOT NULL,
	"status" text NOT NULL,
	"end_reason" text,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL,
	"updated_at" timestamp with time zone DEFAULT now() NOT NULL,
	"ended_at" timestamp with time zone,
	CONSTRAINT "activations_status" CHECK (status in ('starting', 'active', 'draining', 'stopped', 'failed'))
);
--> statement-breakpoint
CREATE TABLE "corral"."actors" (
	"agent_uid" text NOT NULL,
	"session_id" text NOT NULL,
	"epoch_counter" bigint DEFAULT 0 NOT NULL,
	"blocked_by_event_id" uuid,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL,
	"updated_at" timestamp with time zone DEFAULT now() NOT NULL,
	CONSTRAINT "actors_agent_uid_session_id_pk" PRIMARY KEY("agent_uid","session_id"),
	CONSTRAINT "actors_epoch_nonneg" CHECK ("corral"."actors"."epoch_counter" >= 0)
);
--> statement-breakpoint
CREATE TABLE "corral"."conversations" (
	"id" uuid PRIMARY KEY NOT NULL,
	"agent_uid" text NOT NULL,
	"session_id" text NOT NULL,
	"next_seq" integer DEFAULT 1 NOT NULL,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL,
	"updated_at" timestamp with time zone DEFAULT now() NOT NULL
);
--> statement-breakpoint
CREATE TABLE "corral"."dead_letter_actions" (
	"id" bigserial PRIMARY KEY NOT NULL,
	"action" text NOT NULL,
	"dead_letter_id" uuid NOT NULL,
	"event_id" uuid NOT NULL,
	"agent_uid" text NOT NULL,
	"session_id" text NOT NULL,
	"payload" jsonb,
	"outcome" text NOT NULL,
	"acted_at" timestamp with time zone DEFAULT now() NOT NULL,
	"replayed" boolean DEFAULT false NOT NULL
);
--> statement-breakpoint
CREATE TABLE "corral"."deliveries" (
	"delivery_id" uuid PRIMARY KEY NOT NULL,
	"activation_uid" uuid NOT NULL,
	"agent_uid" text NOT NULL,
	"session_id" text NOT NULL,
	"actor_epoch" bigint NOT NULL,
	"event_id" uuid NOT NULL,
	"revision" integer NOT NULL,
	"job_retry_count" integer NOT NULL,
	"worker_id" text,
	"state" text NOT NULL,
	"state_reason" text,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL,
	"updated_at" timestamp with time zone DEFAULT now() NOT NULL,
	CONSTRAINT "deliveries_state" CHECK (state in ('created', 'sent', 'accepted', 'completed', 'failed', 'send_failed', 'superseded'))
);
--> statement-breakpoint
CREATE TABLE "corral"."messages" (
	"id" bigserial PRIMARY KEY NOT NULL,
	"conversation_id" uuid NOT NULL,
	"turn_id" uuid NOT NULL,
	"seq" integer NOT NULL,
	"role" text NOT NULL,
	"content" jsonb NOT NULL,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL,
	CONSTRAINT "messages_role" CHECK (role in ('user', 'assistant', 'tool'))
);
--> statement-breakpoint
CREATE TABLE "corral"."turns" (
	"id" uuid PRIMARY KEY NOT NULL,
	"conversation_id" uuid NOT NULL,
	"event_id" uuid NOT NULL,
	"delivery_id" uuid NOT NULL,
	"status" text NOT NULL,
	"activation_uid" uuid NOT NULL,
	"actor_epoch" bigint NOT NULL,
	"revision" integer NOT NULL,
	"attempt" integer NOT NULL,
	"worker_id" text,
	"input" jsonb,
	"error" jsonb,
	"output" jsonb,
	"started_at" timestamp with time zone DEFAULT now() NOT NULL,
	"finished_at" timestamp with time zone,
	CONSTRAINT "turns_status" CHECK (status in ('started', 'succeeded', 'failed', 'cancelled'))
);
--> statement-breakpoint
CREATE TABLE "corral"."workers" (
	"worker_id" text PRIMARY KEY NOT NULL,
	"owner_id" text NOT NULL,
	"status" text NOT NULL,
	"capacity" integer NOT NULL,
	"in_flight" integer DEFAULT 0 NOT NULL,
	"registered_at" timestamp with time zone DEFAULT now() NOT NULL,
	"last_heartbeat_at" timestamp with time zone DEFAULT now() NOT NULL,
	CONSTRAINT "workers_status" CHECK (status in ('ready', 'stale', 'gone'))
);
--> statement-breakpoint
ALTER TABLE "corral"."deliveries" ADD CONSTRAINT "deliveries_activation_uid_activations_activation_uid_fk" FOREIGN KEY ("activation_uid") REFERENCES "corral"."activations"("activation_uid") ON DELETE no action ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "corral"."messages" ADD CONSTRAINT "messages_conversation_id_conversations_id_fk" FOREIGN KEY ("conversation_id") REFERENCES "corral"."conversations"("id") ON DELETE no action ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "corral"."messages" ADD CONSTRAINT "messages_turn_id_turns_id_fk" FOREIGN KEY ("turn_id") REFERENCES "corral"."turns"("id") ON DELETE no action ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "corral"."turns" ADD CONSTRAINT "turns_conversation_id_conversations_id_fk" FOREIGN KEY ("conversation_id") REFERENCES "corral"."conversations"("id") ON DELETE no action ON UPDATE no action;--> statement-breakpoint
CREATE UNIQUE INDEX "activations_one_live" ON "corral"."activations" USING btree ("agent_uid","session_id") WHERE status in ('starting', 'active', 'draining');--> statement-breakpoint
CREATE INDEX "activations_live_lease" ON "corral"."activations" USING btree ("lease_expires_at") WHERE status in ('starting', 'active', 'draining');--> statement-breakpoint
CREATE INDEX "activations_actor_epoch" ON "corral"."activations" USING btree ("agent_uid","session_id","actor_epoch");--> statement-breakpoint
CREATE UNIQUE INDEX "conversations_actor" ON "corral"."conversations" USING btree ("agent_uid","session_id");--> statement-breakpoint
CREATE INDEX "dead_letter_actions_dl" ON "corral"."dead_letter_actions" USING btree ("dead_letter_id");--> statement-breakpoint
CREATE UNIQUE INDEX "deliveries_one_live_per_event" ON "corral"."deliveries" USING btree ("event_id") WHERE state in ('created', 'sent', 'accepted');--> statement-breakpoint
CREATE INDEX "deliveries_activation" ON "corral"."deliveries" USING btree ("activation_uid");--> statement-breakpoint
CREATE INDEX "deliveries_worker_live" ON "corral"."deliveries" USING btree ("worker_id") WHERE state in ('created', 'sent', 'accepted');--> statement-breakpoint
CREATE UNIQUE INDEX "messages_conversation_seq" ON "corral"."messages" USING btree ("conversation_id","seq");--> statement-breakpoint
CREATE INDEX "messages_turn" ON "corral"."messages" USING btree ("turn_id");--> statement-breakpoint
CREATE UNIQUE INDEX "turns_delivery" ON "corral"."turns" USING btree ("delivery_id");--> statement-breakpoint
CREATE UNIQUE INDEX "turns_one_success_per_event" ON "corral"."turns" USING btree ("event_id") WHERE status = 'succeeded';--> statement-breakpoint
CREATE INDEX "turns_conversation" ON "corral"."turns" USING btree ("conversation_id","started_at");--> statement-breakpoint
CREATE INDEX "turns_started" ON "corral"."turns" USING btree ("started_at") WHERE status = 'started';