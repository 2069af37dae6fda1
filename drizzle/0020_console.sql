CREATE TABLE "corral"."console_sessions" (
	"secret_sha256" text PRIMARY KEY NOT NULL,
	"kind" text NOT NULL,
	"token_name" text NOT NULL,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL,
	"expires_at" timestamp with time zone NOT NULL,
	CONSTRAINT "console_sessions_secret" CHECK (secret_sha256 ~ '^[0-9a-f]{64}$'),
	CONSTRAINT "console_sessions_kind" CHECK (kind in ('sign_in', 'session'))
);
--> statement-breakpoint
ALTER TABLE "corral"."api_tokens" DROP CONSTRAINT "api_tokens_scopes";--> statement-breakpoint
ALTER TABLE "corral"."console_sessions" ADD CONSTRAINT "console_sessions_token_name_api_tokens_name_fk" FOREIGN KEY ("token_name") REFERENCES "corral"."api_tokens"("name") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
CREATE INDEX "console_sessions_token" ON "corral"."console_sessions" USING btree ("token_name");--> statement-breakpoint
CREATE INDEX "console_sessions_expires" ON "corral"."console_sessions" USING btree ("expires_at");--> statement-breakpoint
CREATE INDEX "actors_console" ON "corral"."actors" USING btree (agent_uid collate "C",session_id collate "C");--> statement-breakpoint
CREATE INDEX "actors_console_blocked" ON "corral"."actors" USING btree (agent_uid collate "C",session_id collate "C") WHERE blocked_by_event_id is not null;--> statement-breakpoint
ALTER TABLE "corral"."api_tokens" ADD CONSTRAINT "api_tokens_scopes" CHECK (cardinality(scopes) >= 1 and scopes <@ array['read', 'send', 'admin']::text[]);