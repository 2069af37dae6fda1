ALTER TABLE "corral"."turns" ADD COLUMN "emitted" jsonb;--> statement-breakpoint
ALTER TABLE "corral"."turns" ADD COLUMN "steers" jsonb;