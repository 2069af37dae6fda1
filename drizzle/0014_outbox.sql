CREATE TABLE "corral"."outbox" (
	"id" bigint PRIMARY KEY GENERATED ALWAYS AS IDENTITY (sequence name "corral"."outbox_id_seq" INCREMENT BY 1 MINVALUE 1 MAXVALUE 9223372036854775807 START WITH 1 CACHE 1),
	"sink" text NOT NULL,
	"webhook_id" text NOT NULL,
	"agent_uid" text NOT NULL,
	"session_id" text NOT NULL,
	"turn_id" uuid NOT NULL,
	"event_id" uuid NOT NULL,
	"position" integer NOT NULL,
	"body" text NOT NULL,
	"state" text DEFAULT 'pending' NOT NULL,
	"attempts" integer DEFAULT 0 NOT NULL,
	"attempts_before_replay" integer DEFAULT 0 NOT NULL,
	"next_attempt_at" timestamp with time zone DEFAULT now() NOT NULL,
	"claimed_by" text,
	"claimed_until" timestamp with time zone,
	"last_status" integer,
	"last_error" text,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL,
	"delivered_at" timestamp with time zone,
	"updated_at" timestamp with time zone DEFAULT now() NOT NULL,
	CONSTRAINT "outbox_state" CHECK (state in ('pending', 'delivered', 'dead', 'discarded')),
	CONSTRAINT "outbox_webhook_id" CHECK (char_length(webhook_id) between 1 and 256 and webhook_id ~ '^[\x21-\x7e]+$'),
	CONSTRAINT "outbox_position" CHECK ("corral"."outbox"."position" >= 0)
);
--> statement-breakpoint
ALTER TABLE "corral"."outbox" ADD CONSTRAINT "outbox_sink_sinks_name_fk" FOREIGN KEY ("sink") REFERENCES "corral"."sinks"("name") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
CREATE UNIQUE INDEX "outbox_webhook_id" ON "corral"."outbox" USING btree ("sink","webhook_id");--> statement-breakpoint
CREATE INDEX "outbox_due" ON "corral"."outbox" USING btree ("sink","next_attempt_at","id") WHERE state = 'pending';--> statement-breakpoint
CREATE INDEX "outbox_claimed" ON "corral"."outbox" USING btree ("claimed_until") WHERE claimed_until is not null and state = 'pending';--> statement-breakpoint
CREATE INDEX "outbox_actor_sink" ON "corral"."outbox" USING btree ("agent_uid","session_id","sink","id") WHERE state = 'pending';--> statement-breakpoint
CREATE INDEX "outbox_turn" ON "corral"."outbox" USING btree ("turn_id");--> statement-breakpoint
CREATE INDEX "outbox_state" ON "corral"."outbox" USING btree ("state","id");--> statement-breakpoint
CREATE INDEX "outbox_finished" ON "corral"."outbox" USING btree ("updated_at") WHERE state in ('delivered', 'discarded');